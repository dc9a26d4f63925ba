"""The bounded stop's parts, in child processes: the watchdog ends a process whose main thread
cannot act on SIGTERM, and a stopped server does not wait for a thread stuck past its deadline."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def child(code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_watchdog_ends_a_process_whose_main_thread_ignores_sigterm() -> None:
    # the Python handler does nothing (a main thread that never gets to stop the server): only the
    # watchdog's C-level wake-up (faulthandler, chained) can arm it
    proc = child(
        """
        import signal, sys, time
        from areal_tasks.inference.server.shutdown import ShutdownWatchdog

        signal.signal(signal.SIGTERM, lambda *_: None)
        told = []
        watchdog = ShutdownWatchdog(0.5, lambda: told.append(1))
        with watchdog.watch_signals():
            print("ready", flush=True)
            while True:
                time.sleep(0.05)
        """
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert "did not stop within 0.5 s of SIGTERM: exiting now" in proc.stdout.read()


def test_a_stopped_server_does_not_wait_for_a_stuck_thread() -> None:
    proc = child(
        """
        import threading
        from areal_tasks.inference.server.shutdown import exit_if_threads_linger

        threading.Thread(target=threading.Event().wait, name="areal-groups_0").start()  # never returns
        exit_if_threads_linger(0.1)
        raise SystemExit(3)  # not reached
        """
    )
    assert proc.wait(timeout=60) == 0
    assert proc.stdout is not None and "not waited for: areal-groups_0" in proc.stdout.read()


def test_only_a_second_sigint_skips_the_graceful_stop() -> None:
    from areal_tasks.inference.server.shutdown import forces_exit

    assert not forces_exit(0, signal.SIGINT)  # the first, even when the stop was already asked for
    assert not forces_exit(0, signal.SIGTERM)
    assert forces_exit(1, signal.SIGINT)
    assert not forces_exit(1, signal.SIGTERM)
