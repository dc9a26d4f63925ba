"""Stop every live scheduler's workers when the controlling Python process exits.

``atexit`` covers a normal exit, an uncaught exception and Ctrl-C (KeyboardInterrupt). SIGTERM and
SIGHUP would end the interpreter without running ``atexit``, so, when they still have their default
disposition and we are on the main thread, they are turned into ``SystemExit(128 + signum)``, which
unwinds ``finally`` blocks and then runs ``atexit``. Handlers that someone else installed are left
alone. Nothing here helps against SIGKILL of the controller; cluster backends rely on their own
job cleanup for that.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import weakref
from types import FrameType
from typing import Protocol

logger = logging.getLogger(__name__)

__all__ = ["register"]


class _Stoppable(Protocol):
    def stop_all(self, grace_s: float = ...) -> None: ...


_live: weakref.WeakSet[_Stoppable] = weakref.WeakSet()
_lock = threading.Lock()
_installed = False
_EXIT_GRACE_S = 5.0


def _stop_live_schedulers() -> None:
    for scheduler in list(_live):
        try:
            scheduler.stop_all(grace_s=_EXIT_GRACE_S)
        except Exception:
            # At interpreter exit there is no caller left to re-raise to: log and go on stopping the rest.
            logger.exception("stopping workers at exit failed for %r", scheduler)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    logger.warning("received %s: stopping workers and exiting", signal.Signals(signum).name)
    raise SystemExit(128 + signum)


def _install_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        logger.debug("not on the main thread: SIGTERM/SIGHUP left as they are (atexit still stops workers)")
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _exit_on_signal)


def register(scheduler: _Stoppable, handle_signals: bool = True) -> None:
    """Have ``scheduler.stop_all()`` run when this process exits (held weakly)."""
    global _installed
    with _lock:
        _live.add(scheduler)
        if not _installed:
            atexit.register(_stop_live_schedulers)
            _installed = True
    if handle_signals:
        _install_signal_handlers()
