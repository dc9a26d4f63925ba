"""Main program of one reward worker process (started by :mod:`areal_tasks.rollout.rewards._pool`).

Run by file path with the standard library only, so a worker imports nothing but the reward's own
module. Protocol: length-prefixed pickle frames (8-byte big-endian size). The first frame from the
parent is ``{"sys_path", "module", "qualname"}``; the worker answers ``("ready", pid)`` or
``("error", type, message, traceback)``. Then each request ``(completion, answer, kwargs)`` gets
one of ``("ok", float)``, ``("not_a_number", type_name, repr)`` or ``("error", type, message,
traceback)``. EOF on the request pipe ends the worker; so does the parent going away (a watchdog
thread polls the parent pid, so a worker stuck in a reward is not orphaned).

The protocol runs on private copies of fds 0 and 1: the reward's ``print`` goes to stderr and it
cannot read the requests.

On Linux the worker is a child subreaper: a process the reward starts stays below the worker even
after its own parent exits (a daemon's double fork), so the pool's tree kill finds it by parent pid
while the worker lives. Adopted orphans are reaped when the worker ends (a ``SIGCHLD`` reaper here
would steal exit codes from a reward's own ``subprocess`` calls).
"""

from __future__ import annotations

import importlib
import numbers
import os
import pickle
import struct
import sys
import threading
import time
import traceback
from typing import Any, BinaryIO

_HEADER = struct.Struct(">Q")
_PARENT_POLL_S = 0.5


def _read_frame(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError
    return pickle.loads(payload)


def _write_frame(stream: BinaryIO, message: Any) -> None:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(payload)) + payload)
    stream.flush()


def _error(exc: BaseException) -> tuple[str, str, str, str]:
    return ("error", type(exc).__name__, str(exc), traceback.format_exc())


def _watch_parent(parent_pid: int) -> None:
    """Exit at once when the parent dies (its children are re-parented, so getppid changes)."""
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(3)


_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Adopt orphaned descendants (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``); a warning where unsupported."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        sys.stderr.write(f"reward worker {os.getpid()}: cannot become a child subreaper: {os.strerror(error)}\n")


def _resolve(module: str, qualname: str) -> Any:
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    init = _read_frame(requests)
    sys.path[:] = init["sys_path"]
    try:
        fn = _resolve(init["module"], init["qualname"])
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises RewardError
        _write_frame(replies, _error(exc))
        return
    _write_frame(replies, ("ready", os.getpid()))
    while True:
        try:
            completion, answer, kwargs = _read_frame(requests)
        except EOFError:
            return
        try:
            value = fn(completion, answer, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - a failing reward must not end the worker
            reply: tuple[Any, ...] = _error(exc)
        else:
            if isinstance(value, numbers.Real):
                reply = ("ok", float(value))
            else:
                reply = ("not_a_number", type(value).__name__, repr(value)[:200])
        _write_frame(replies, reply)


def main() -> None:
    """Swap the protocol onto private fds, start the parent watchdog and serve requests until EOF."""
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    threading.Thread(target=_watch_parent, args=(int(sys.argv[1]),), daemon=True).start()
    _become_subreaper()
    _serve(requests, replies)


if __name__ == "__main__":
    main()
