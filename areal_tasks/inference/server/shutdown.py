"""A bounded stop: after SIGTERM or SIGINT the server process is gone within ``shutdown_timeout_s``.

Three things used to keep it alive: uvicorn waited without limit for open connections (a request
blocked on a hung weight-group rendezvous), the event loop may be blocked, and at exit the
interpreter joins every executor thread, including one blocked in a rendezvous that never ends.

* uvicorn stops accepting, waits at most a third of the budget for requests in flight
  (``timeout_graceful_shutdown``), cancels the rest and runs the app's lifespan shutdown (the
  engine and the weight-update groups, each bounded: ``server.build_app``).
* A watchdog thread (:class:`ShutdownWatchdog`) is armed by the first signal and ends the process
  (``os._exit(128 + signal)``, logged) if it still runs when the budget is spent. It must learn of
  the signal even when the main thread cannot run Python (stuck in a C call, or the event loop
  blocked): Python runs signal handlers only in the main thread, and the event loop (uvloop)
  takes the wakeup fd for itself. So the watchdog also registers ``faulthandler`` for the stop
  signals, writing into a pipe it reads (``chain=True``: uvicorn's handler still runs): that C
  handler is async-signal-safe and runs at once in whichever thread the kernel picked. It also
  tells uvicorn to stop, as uvicorn's own handler does when the main thread gets to run it.
* After uvicorn returned, threads still running (a lane call past its deadline) are not waited
  for: :func:`exit_if_threads_linger` ends the process at once.

No signal mask is changed, so processes the server starts get the default dispositions.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["STOP_SIGNALS", "ShutdownWatchdog", "exit_if_threads_linger", "forces_exit", "serve_until_stopped"]

#: the signals that stop the server.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ShutdownWatchdog:
    """Ends the process ``timeout_s`` seconds after :meth:`arm` unless it ended before; calls
    ``on_signal()`` from its own thread when a stop signal arrives (see the module doc).

    :meth:`watch_signals` (main thread, after the signals' Python handlers are installed: it
    chains to them) makes a stop signal arm it from C, whatever the main thread does.
    """

    def __init__(self, timeout_s: float, on_signal: Callable[[], None]) -> None:
        self.timeout_s = timeout_s
        self.on_signal = on_signal
        self._armed = threading.Event()
        self._first: int = signal.SIGTERM
        self._lock = threading.Lock()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)  # a full pipe drops a dump, never blocks the handler
        threading.Thread(target=self._wake_on_dumps, name="areal-stop-signals", daemon=True).start()
        threading.Thread(target=self._expire, name="areal-shutdown-watchdog", daemon=True).start()

    def arm(self, signum: int) -> None:
        """Start the countdown (the first call counts; later ones do nothing)."""
        with self._lock:
            if self._armed.is_set():
                return
            self._first = signum
            self._armed.set()
        logger.info("%s: stopping (the process ends within %g s)", signal.Signals(signum).name, self.timeout_s)

    @contextlib.contextmanager
    def watch_signals(self) -> Iterator[None]:
        """While inside, a stop signal arms the watchdog from its C handler (``faulthandler``)."""
        for sig in STOP_SIGNALS:
            faulthandler.register(sig, file=self._write_fd, all_threads=False, chain=True)
        try:
            yield
        finally:
            for sig in STOP_SIGNALS:
                faulthandler.unregister(sig)

    def _wake_on_dumps(self) -> None:
        while os.read(self._read_fd, 65536):  # a traceback dump: some stop signal arrived
            self.arm(self._first)
            self.on_signal()

    def _expire(self) -> None:
        self._armed.wait()
        time.sleep(self.timeout_s)
        logger.error(
            "the server did not stop within %g s of %s: exiting now",
            self.timeout_s,
            signal.Signals(self._first).name,
        )
        logging.shutdown()
        os._exit(128 + self._first)


def exit_if_threads_linger(grace_s: float = 1.0) -> None:
    """End the process now (exit code 0) when threads other than this one still run ``grace_s``
    seconds after the server stopped: a lane call past its deadline that the interpreter's exit
    would wait for without end. Logs their names first."""
    deadline = time.monotonic() + grace_s
    others = [t for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
    for thread in others:
        thread.join(max(0.0, deadline - time.monotonic()))
    lingering = [t.name for t in others if t.is_alive()]
    if lingering:
        logger.warning("threads still running after the server stopped, not waited for: %s", ", ".join(lingering))
        logging.shutdown()
        os._exit(0)


def forces_exit(signals_seen: int, sig: int) -> bool:
    """Whether a stop signal makes uvicorn skip the graceful part of the stop: a second SIGINT
    does (uvicorn's rule), a first never does. uvicorn decided by ``should_exit`` being set
    already, which the watchdog's wake-up (``_wake_on_dumps``) or a dead front end may have done
    before the main thread ran the handler: a single Ctrl-C then skipped the app's shutdown."""
    return signals_seen > 0 and sig == signal.SIGINT


def serve_until_stopped(
    app: Any,
    *,
    shutdown_timeout_s: float,
    on_serving: Callable[[Callable[[], None]], None] | None = None,
    **uvicorn_config: Any,
) -> None:
    """Run ``app`` on uvicorn until SIGTERM/SIGINT, the whole stop bounded by ``shutdown_timeout_s``
    (see the module doc); ``uvicorn_config``: :class:`uvicorn.Config` arguments (host, port...).
    ``on_serving``, when given, gets a function that starts the same bounded stop as SIGTERM (for
    a part of the server that fails while it serves)."""
    import uvicorn

    watchdog: ShutdownWatchdog | None = None

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """uvicorn's handlers, the watchdog's on top, and no signal raised again after the
            shutdown (this process is ours: returning is the stop)."""
            if watchdog is None:
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
            try:
                with watchdog.watch_signals():
                    yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

        signals_seen = 0

        def handle_exit(self, sig: int, frame: Any) -> None:
            if watchdog is not None:
                watchdog.arm(sig)
            if forces_exit(self.signals_seen, sig):
                self.force_exit = True
            self.should_exit = True
            self.signals_seen += 1

    config = uvicorn.Config(app, timeout_graceful_shutdown=max(1, round(shutdown_timeout_s / 3)), **uvicorn_config)
    server = _Server(config)

    def stop() -> None:
        server.should_exit = True  # uvicorn's handler does the same once the main thread runs it

    if threading.current_thread() is threading.main_thread():
        watchdog = ShutdownWatchdog(shutdown_timeout_s, stop)
    else:
        logger.warning("serving outside the main thread: no shutdown watchdog")

    def stop_as_sigterm() -> None:
        if watchdog is not None:
            watchdog.arm(signal.SIGTERM)
        stop()

    if on_serving is not None:
        on_serving(stop_as_sigterm)
    server.run()
    exit_if_threads_linger()
