"""Follow a detached job from the terminal that submitted it: its log, its end, Ctrl-C.

``areal train`` run outside the cluster (and ``areal launch`` without ``--detach``) submits the job
through the scheduler kind's :class:`~areal_tasks.api.jobs.JobBackend` and then calls :func:`follow`,
which works the same for every backend:

* every ``poll_s`` seconds it relays the log lines that are new since the last poll. When the job's
  log is a file this machine can read (``JobStatus.log_path``: the local backend, SLURM on a shared
  filesystem) it reads from an offset; otherwise it diffs successive ``log_tail`` windows
  (:func:`new_lines`). The last, maybe incomplete, line is held back until the job ends;
* Ctrl-C or SIGTERM cancels the job (``backend.cancel``) and returns 130;
* the final state becomes the exit code: 0 succeeded, 1 failed (the reason is printed), 130
  cancelled; the job's ``summary.json`` is printed at the end when the run directory is readable here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from areal_tasks.api.jobs import JobBackend, JobStatus

logger = logging.getLogger(__name__)

__all__ = ["EXIT_CANCELLED", "EXIT_FAILED", "EXIT_SUCCEEDED", "exit_code_of", "follow", "new_lines"]

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
#: what a shell reports for a command ended by Ctrl-C (128 + SIGINT).
EXIT_CANCELLED = 130
#: seconds between polls of the job.
POLL_S = 2.0
#: lines asked of ``log_tail`` per poll when the log is not a local file.
TAIL_WINDOW = 1000
#: seconds a cancelled job gets between SIGTERM and SIGKILL.
CANCEL_GRACE_S = 30.0


def exit_code_of(status: JobStatus) -> int:
    """The exit code of ``areal train`` for a job that ended in ``status``."""
    if status.state == "succeeded":
        return EXIT_SUCCEEDED
    if status.state == "cancelled":
        return EXIT_CANCELLED
    return EXIT_FAILED


def new_lines(previous: list[str], current: list[str]) -> list[str]:
    """The lines of the log window ``current`` that come after the window ``previous``.

    The longest suffix of ``previous`` that is a prefix of ``current`` is the overlap; what follows
    it is new. Without any overlap (more was written between the polls than a window holds) all of
    ``current`` is new. A run of identical lines longer than the overlap can hide repeats: the
    relay is for people, the job's log file stays the record.
    """
    if not previous:
        return list(current)
    first = current[0] if current else None
    for k in range(min(len(previous), len(current)), 0, -1):
        if previous[-k] == first and previous[-k:] == current[:k]:
            return list(current[k:])
    return list(current)


class _LogRelay:
    """Prints the new lines of one job's log on each :meth:`poll` (see the module docstring)."""

    def __init__(self, backend: JobBackend, name: str, out: IO[str]) -> None:
        self.backend = backend
        self.name = name
        self.out = out
        self._path: Path | None = None
        self._offset = 0
        self._window: list[str] = []

    def poll(self, status: JobStatus, *, final: bool = False) -> None:
        path = Path(status.log_path) if status.log_path else None
        if path is not None and path != self._path and os.access(path, os.R_OK):
            self._path, self._offset = path, 0  # a new attempt's log (or the first look): from its start
        if self._path is not None and self._path == path:
            self._poll_file(final)
        else:
            self._poll_tail(final)
        self.out.flush()

    def _poll_file(self, final: bool) -> None:
        assert self._path is not None
        with open(self._path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = len(data) if final else data.rfind(b"\n") + 1
        if end > 0:
            self.out.write(data[:end].decode("utf-8", errors="replace"))
            if final and not data.endswith(b"\n"):
                self.out.write("\n")
            self._offset += end

    def _poll_tail(self, final: bool) -> None:
        lines = self.backend.log_tail(self.name, TAIL_WINDOW).splitlines()
        complete = lines if final else lines[:-1]
        for line in new_lines(self._window, complete):
            self.out.write(line + "\n")
        self._window = complete


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (like Ctrl-C) while following, in the main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def follow(
    backend: JobBackend,
    name: str,
    *,
    run_dir: str | None = None,
    poll_s: float = POLL_S,
    cancel_grace_s: float = CANCEL_GRACE_S,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    format_summary: Callable[[dict[str, Any]], str] | None = None,
) -> int:
    """Relay job ``name``'s log until it ends; return its exit code (see :func:`exit_code_of`).

    Ctrl-C (or SIGTERM) cancels the job, waits for it to stop (``cancel_grace_s`` before SIGKILL)
    and returns 130. ``run_dir`` is where the job's ``summary.json`` is looked for at the end.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    relay = _LogRelay(backend, name, out)
    try:
        with _sigterm_as_interrupt():
            while True:
                status = backend.status(name)
                if status.terminal or status.state == "missing":
                    break
                relay.poll(status)
                time.sleep(poll_s)
    except KeyboardInterrupt:
        err.write(f"\ninterrupted: cancelling job {name} (up to {cancel_grace_s:.0f} s for it to stop)\n")
        err.flush()
        status = backend.cancel(name, cancel_grace_s)
        relay.poll(status, final=True)
        err.write(f"job {name}: {status.state} ({status.reason})\n")
        return EXIT_CANCELLED
    relay.poll(status, final=True)
    code = exit_code_of(status)
    if status.state == "succeeded":
        _print_summary(run_dir or status.run_dir, out, format_summary)
        out.write(f"job {name} succeeded ({status.handle}, attempt {status.attempt})\n")
    elif status.state == "cancelled":
        err.write(f"job {name} was cancelled: {status.reason}\n")
    else:
        err.write(f"job {name} {status.state}: {status.reason}\n")
    out.flush()
    err.flush()
    return code


def _print_summary(run_dir: str | None, out: IO[str], format_summary: Callable[[dict[str, Any]], str] | None) -> None:
    if not run_dir:
        return
    from areal_tasks.api.run_dir import RunPaths

    path = RunPaths.of(run_dir).summary
    if not path.is_file():
        logger.info("no %s readable here: the summary stays with the job's run directory", path)
        return
    summary = json.loads(path.read_text(encoding="utf-8"))
    formatter = format_summary or _default_format
    out.write(formatter(summary) + "\n")
    out.write(f"summary: {path}\n")


def _default_format(summary: dict[str, Any]) -> str:
    """The RL summary table (``areal train``'s), or the JSON for a summary of another shape."""
    from areal_tasks.trainer.rl import format_summary

    try:
        return format_summary(summary)
    except KeyError:
        return json.dumps(summary, indent=1, sort_keys=True)
