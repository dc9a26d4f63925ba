"""Worker processes for :class:`~areal_tasks.rollout.rewards.runner.RewardRunner`.

Each worker is a fresh interpreter (``sys.executable _worker.py``, never ``fork``: the caller has
torch and threads) in its own session, so a hung or crashed reward can be killed, process group and
all, without touching the caller or the other workers. It receives the caller's ``sys.path`` (as
``multiprocessing``'s spawn does) and imports only the reward's module; unlike spawn it does not
re-import the caller's ``__main__``, which in a trainer would pull in torch. Workers start lazily,
at most ``size`` at a time; one that timed out or died is reaped (``wait``) and replaced on demand.

A reward may start processes of its own, and some leave the worker's session (``setsid``, a
daemon's double fork) where ``killpg`` does not reach them. So each worker carries a marker in its
environment (inherited by whatever it starts) and makes itself a child subreaper (orphans below it
are re-parented to it, not to init); killing a worker is
:func:`~areal_tasks.launch.process.kill_tree`: freeze the worker, its group, its descendants and
every process with its marker, then SIGKILL them all. An idle worker closed with EOF is swept too,
so a reward's background process does not outlive the pool.
"""

from __future__ import annotations

import importlib
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_tasks.errors import RewardError
from areal_tasks.launch.process import kill_tree, new_marker, with_marker

logger = logging.getLogger(__name__)

_WORKER_FILE = str(Path(__file__).with_name("_worker.py"))
_HEADER_SIZE = 8


class WorkerTimeout(Exception):
    """The worker did not answer before the deadline (it has been killed)."""


class WorkerDied(Exception):
    """The worker exited (crashed, killed, or the pool closed) while serving a request."""


class SendError(Exception):
    """A request cannot be pickled for a worker (nothing was sent)."""


def importable_path(fn: Callable[..., Any]) -> tuple[str, str]:
    """``(module, qualname)`` by which a worker can import ``fn``; RewardError if there is none."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    hint = "define it at module level in an importable module, or use max_workers=0 (in-process)"
    if not module or not qualname or "<" in qualname or module == "__main__":
        raise RewardError(f"reward {fn!r} cannot be imported by a worker process: {hint}")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not fn:
        raise RewardError(f"reward {fn!r} is not reachable as {module}:{qualname}: {hint}")
    return module, qualname


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, size: int, deadline: float) -> bytes:
    chunks, left = [], size
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise WorkerTimeout
        chunk = os.read(fd, left)
        if not chunk:
            raise WorkerDied
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class WorkerProcess:
    """One worker interpreter serving one reward function, one request at a time."""

    def __init__(self, module: str, qualname: str, start_timeout_s: float) -> None:
        self.marker = new_marker("reward")
        self.proc = subprocess.Popen(
            [sys.executable, _WORKER_FILE, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,
            env=with_marker(os.environ, self.marker),
        )
        try:
            init = {"sys_path": list(sys.path), "module": module, "qualname": qualname}
            reply = self.request(pickle.dumps(init), start_timeout_s)
        except (WorkerTimeout, WorkerDied, OSError) as exc:
            self.kill()
            raise RewardError(
                f"reward worker for {module}:{qualname} did not start within {start_timeout_s:g} s "
                f"({type(exc).__name__}, exit code {self.proc.returncode})"
            ) from exc
        if reply[0] != "ready":
            self.kill()
            raise RewardError(f"reward worker cannot load {module}:{qualname}: {reply[1]}: {reply[2]}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def request(self, payload: bytes, timeout_s: float) -> tuple[Any, ...]:
        """Send one pickled frame and wait up to ``timeout_s`` for the reply frame."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            _write_all(self.proc.stdin.fileno(), len(payload).to_bytes(_HEADER_SIZE, "big") + payload)
        except (BrokenPipeError, ValueError) as exc:  # ValueError: pipe closed by kill()
            raise WorkerDied from exc
        deadline = time.monotonic() + timeout_s
        try:
            size = int.from_bytes(_read_exact(self.proc.stdout.fileno(), _HEADER_SIZE, deadline), "big")
            return pickle.loads(_read_exact(self.proc.stdout.fileno(), size, deadline))
        except (ValueError, OSError) as exc:  # the pipes were closed under us by kill()
            raise WorkerDied from exc

    def kill(self) -> None:
        """SIGKILL the worker and everything it started, reap it and close the pipes (owner thread only)."""
        _signal_kill(self.proc, self.marker)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def _signal_kill(proc: subprocess.Popen[bytes], marker: str) -> None:
    """SIGKILL the worker and every process it started, escaped ones included; does not reap.

    The worker's pid is used only while it is not reaped (so it cannot have been recycled); after
    that its marker still finds what it left behind.
    """
    pid = proc.pid if proc.returncode is None else None
    left = kill_tree(pid, marker)
    if left:
        logger.error("reward worker %s: processes %s survived SIGKILL (uninterruptible sleep?)", proc.pid, left)


def _kill_and_reap(procs: dict[subprocess.Popen[bytes], str]) -> None:
    for proc, marker in list(procs.items()):
        _signal_kill(proc, marker)
        proc.wait()


class WorkerPool:
    """Up to ``size`` workers for one reward; :meth:`run` borrows an idle one (or starts one)."""

    def __init__(self, fn: Callable[..., Any], size: int, start_timeout_s: float) -> None:
        self.module, self.qualname = importable_path(fn)
        self.start_timeout_s = start_timeout_s
        self.started = 0
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[WorkerProcess] = []
        self._live: dict[subprocess.Popen[bytes], str] = {}  # process -> its marker
        self._closed = False
        # kill leftovers if the runner is dropped without close(), and at interpreter exit
        self._finalizer = weakref.finalize(self, _kill_and_reap, self._live)

    def run(self, request: tuple[str, str, dict[str, Any]], timeout_s: float) -> tuple[tuple[Any, ...], int]:
        """``(reply, pid)``; WorkerTimeout / WorkerDied after the worker has been killed and reaped."""
        try:
            payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SendError(f"the arguments cannot be pickled for a worker process: {exc!r}") from exc
        with self._slots:
            worker = self._take()
            try:
                reply = worker.request(payload, timeout_s)
            except BaseException:
                self._discard(worker)
                raise
            with self._lock:
                if not self._closed:
                    self._idle.append(worker)
                    return reply, worker.pid
            self._discard(worker)
            return reply, worker.pid

    def _take(self) -> WorkerProcess:
        while True:
            with self._lock:
                if self._closed:
                    raise WorkerDied
                if not self._idle:
                    self.started += 1
                    break
                worker = self._idle.pop()
            if worker.proc.poll() is None:
                return worker
            self._discard(worker)  # died while idle (killed from outside): start another
        worker = WorkerProcess(self.module, self.qualname, self.start_timeout_s)
        with self._lock:
            closed = self._closed
            if not closed:
                self._live[worker.proc] = worker.marker
        if closed:
            worker.kill()
            raise WorkerDied
        return worker

    def _discard(self, worker: WorkerProcess) -> None:
        worker.kill()
        with self._lock:
            self._live.pop(worker.proc, None)

    def pids(self) -> list[int]:
        """PIDs of the live worker processes (idle and busy)."""
        with self._lock:
            return sorted(proc.pid for proc in self._live if proc.poll() is None)

    def close(self, grace_s: float = 1.0) -> None:
        """Stop every worker: idle ones exit on EOF, busy ones are killed (their calls then fail)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = [(proc, marker) for proc, marker in self._live.items() if all(proc is not w.proc for w in idle)]
        for worker in idle:
            try:
                if worker.proc.stdin is not None:
                    worker.proc.stdin.close()  # the worker exits on EOF
                worker.proc.wait(timeout=grace_s)
            except (subprocess.TimeoutExpired, OSError):
                pass
            self._discard(worker)
        for proc, marker in busy:
            _signal_kill(proc, marker)  # the thread using it sees EOF, then reaps it in _discard
        self._finalizer.detach()
