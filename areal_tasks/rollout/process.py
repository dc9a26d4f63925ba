"""Train rank 0's rollout side in a child process, so generation does not share the trainer's interpreter.

The rollout side (:class:`~areal_tasks.rollout.side.RolloutSide`: inference client, reward pool,
workflows, the executor's event loop with up to ``rollout.max_concurrent_rollouts`` episodes in
flight, evaluation) is Python work that never stops while the run is asynchronous. In rank 0's own
process it competes with the training step for one interpreter lock, so an asynchronous run's
training steps take longer than a synchronous run's although the trainer has its GPU to itself
(docs/benchmarks.md has the figures). ``rollout.own_process: on`` (``auto``, the default, is on
when training runs on GPUs) runs the side in a child process instead:

- :meth:`RolloutProcess.start` spawns it (``spawn``: rank 0 may hold CUDA state, which a fork must
  not inherit), the child loads the tokenizer, builds the side and freezes its start-up heap out of
  the garbage collector's sight (``gc_heap.py``: full collections took 40% of the RL client's CPU
  under bursts of calls), then answers commands over a pipe: one at a time, in the order sent. A
  command is a name from :data:`COMMANDS`; its reply is the result or the exception it raised,
  re-raised here with the child's traceback as a note.
- :class:`RemoteExecutor` implements :class:`~areal_tasks.api.rollout.RolloutExecutorProtocol`:
  each protocol method is a command (the command table and the proxy are both derived from
  :data:`~areal_tasks.api.rollout.EXECUTOR_METHODS`), so the loop does not know which side it
  holds. Batches come back as pickled trajectories (lists of ints and floats).
- A child that dies is noticed by the next command (or the one waiting), which raises
  :class:`RolloutError` with its exit code; a parent that dies is noticed by the child, which
  closes its side (servers' connections, reward workers) and exits.
- :meth:`RolloutProcess.close` stops the side and waits for the child (bounded), then kills it.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import multiprocessing
import os
import pickle
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from areal_tasks.api.rollout import EXECUTOR_METHODS, Returns, RolloutExecutorProtocol
from areal_tasks.errors import RolloutError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from areal_tasks.config.job import JobConfig
    from areal_tasks.rollout.side import RolloutSide

logger = logging.getLogger(__name__)

__all__ = ["COMMANDS", "RemoteExecutor", "RolloutProcess"]

#: what the parent may ask for: a dotted name on the child's side -> whether its result is sent back
#: (every executor protocol method is one; ``start`` returns the executor, which stays in the child).
COMMANDS: dict[str, bool] = {
    "evaluate": True,
    **{f"executor.{name}": returns == "value" for name, returns in EXECUTOR_METHODS.items()},
}
#: seconds the child may take to import, load the tokenizer and build the side.
START_TIMEOUT_S = 300.0
#: seconds :meth:`RolloutProcess.close` waits for the child to stop its side and exit before killing it.
CLOSE_TIMEOUT_S = 60.0
#: seconds between two looks at the other process while waiting for it.
_POLL_S = 0.5


class RemoteExecutor:
    """The executor protocol over the pipe: every method of
    :class:`~areal_tasks.api.rollout.RolloutExecutorProtocol` runs as a command in the child
    (the methods are made from the protocol's, below)."""

    def __init__(self, process: RolloutProcess) -> None:
        self._process = process


def _forward(name: str, returns: Returns) -> Callable[..., Any]:
    """A :class:`RemoteExecutor` method that runs ``executor.<name>`` in the child."""
    declared = getattr(RolloutExecutorProtocol, name)

    def method(self: RemoteExecutor, *args: Any, **kwargs: Any) -> Any:
        result = self._process.call(f"executor.{name}", *args, **kwargs)
        return self if returns == "self" else result

    method.__name__ = method.__qualname__ = name
    method.__doc__ = declared.__doc__
    method.__signature__ = inspect.signature(declared)  # type: ignore[attr-defined]
    return method


for _name, _returns in EXECUTOR_METHODS.items():
    setattr(RemoteExecutor, _name, _forward(_name, _returns))


class RolloutProcess:
    """A :class:`RolloutSide` running in a child process; same surface as the in-process one."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection, n_servers: int) -> None:
        self._process, self._conn = process, conn
        self._lock = threading.Lock()
        self._closed = False
        #: number of inference servers the side's client talks to.
        self.n_servers = n_servers
        self.executor: RolloutExecutorProtocol = RemoteExecutor(self)  # type: ignore[assignment]

    @classmethod
    def start(
        cls, cfg: JobConfig, addresses: list[str], model_dir: str, version: int, timeout_s: float = START_TIMEOUT_S
    ) -> RolloutProcess:
        """Spawn the child and build the job's rollout side there (see :meth:`spawn`)."""
        return cls.spawn(_build_side, (cfg, list(addresses), model_dir, version), timeout_s=timeout_s)

    @classmethod
    def spawn(
        cls, build: Callable[..., Any], args: tuple[Any, ...], *, timeout_s: float = START_TIMEOUT_S
    ) -> RolloutProcess:
        """Spawn the child and run ``build(*args)`` there: the side it serves (an object with
        ``executor``, ``n_servers``, ``evaluate`` and ``close``; ``build`` and ``args`` must pickle).

        A build that fails raises its own exception here (the child's traceback as a note); a child
        that dies, or takes longer than ``timeout_s``, raises :class:`RolloutError`.
        """
        ctx = multiprocessing.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        process = ctx.Process(
            target=_child_main,
            args=(child_conn, build, args, os.getpid()),
            name="areal-rollout",
            daemon=False,
        )  # a daemon may not start reward workers
        started = time.monotonic()
        process.start()
        child_conn.close()
        try:
            status, value = _receive(parent_conn, process, timeout_s, "build the rollout side")
            if status != "ready":
                raise value
        except BaseException:
            _stop_process(process, 5.0)
            parent_conn.close()
            raise
        logger.info(
            "rollout side in process %d (%d servers), built in %.1f s", process.pid, value, time.monotonic() - started
        )
        return cls(process, parent_conn, int(value))

    @property
    def pid(self) -> int | None:
        """The child's process id."""
        return self._process.pid

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run command ``name`` (a key of :data:`COMMANDS`) in the child; its result, or its exception raised here."""
        if name not in COMMANDS:
            raise RolloutError(f"{name!r} is not a rollout-process command; known: {', '.join(sorted(COMMANDS))}")
        with self._lock:
            if self._closed:
                raise RolloutError(f"the rollout process was closed; {name} cannot run")
            try:
                self._conn.send((name, args, kwargs))
            except (BrokenPipeError, EOFError, OSError) as exc:
                raise _death(self._process, name) from exc
            status, value = _receive(self._conn, self._process, None, name)
        if status == "error":
            raise value
        return value

    def evaluate(self, n_prompts: int | None = None, *, greedy: bool = False) -> dict[str, float]:
        """Mean reward and accuracy of the served policy on the eval split (see ``RolloutSide.evaluate``)."""
        return self.call("evaluate", n_prompts, greedy=greedy)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the side (executor, reward pool) and the child; idempotent, never raises for a dead child.

        A command still running in another thread (a weight update whose broadcast failed) gets
        ``timeout_s`` to return; after that the child is killed, and that command raises.
        """
        if not self._lock.acquire(timeout=timeout_s):
            logger.warning(
                "rollout process %d: a command is still running %.0f s into close; killing the process",
                self._process.pid,
                timeout_s,
            )
            _stop_process(self._process, 5.0)
            self._lock.acquire()
        try:
            if self._closed:
                return
            self._closed = True
            # already gone: nothing left to stop but the process object
            with contextlib.suppress(BrokenPipeError, EOFError, OSError):
                self._conn.send(None)
            self._process.join(timeout_s)
            if self._process.is_alive():
                logger.warning(
                    "rollout process %d did not exit within %.0f s of close; killing it", self._process.pid, timeout_s
                )
            _stop_process(self._process, 5.0)
            self._conn.close()
        finally:
            self._lock.release()


def _receive(
    conn: Connection, process: multiprocessing.process.BaseProcess, timeout_s: float | None, what: str
) -> tuple[str, Any]:
    """The child's next message, watching that it is alive (and, with ``timeout_s``, not too slow)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not conn.poll(_POLL_S):
        if not process.is_alive() and not conn.poll(0):
            raise _death(process, what)
        if deadline is not None and time.monotonic() > deadline:
            raise RolloutError(f"the rollout process (pid {process.pid}) did not {what} within {timeout_s:.0f} s")
    try:
        return conn.recv()
    except (EOFError, OSError) as exc:  # OSError: the pipe was reset by a child that died
        raise _death(process, what) from exc


def _death(process: multiprocessing.process.BaseProcess, what: str) -> RolloutError:
    process.join(1.0)
    return RolloutError(
        f"the rollout process (pid {process.pid}) died (exit code {process.exitcode}) before it "
        f"could {what}; its log lines are in this worker's log above"
    )


def _stop_process(process: multiprocessing.process.BaseProcess, grace_s: float) -> None:
    if process.is_alive():
        process.terminate()
        process.join(grace_s)
    if process.is_alive():
        process.kill()
        process.join(grace_s)


# ---------------------------------------------------------------------------------------------- child


def _portable(exc: BaseException) -> BaseException:
    """``exc`` with the child's traceback as a note, or a RolloutError naming it when it does not pickle."""
    note = "in the rollout process:\n" + "".join(traceback.format_exception(exc)).rstrip()
    try:
        exc.add_note(note)
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure: send a plain error with the same text
        plain = RolloutError(f"{type(exc).__name__}: {exc}")
        plain.add_note(note)
        return plain


def _resolve(side: RolloutSide, name: str) -> Any:
    target: Any = side
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _watch_parent(parent_pid: int, side: RolloutSide) -> None:
    """Close the side and exit when the parent is gone (killed before it could send close)."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    logger.warning("the RL worker (pid %d) is gone: closing the rollout side and exiting", parent_pid)
    closer = threading.Thread(target=side.close, name="rollout-close", daemon=True)
    closer.start()
    closer.join(CLOSE_TIMEOUT_S / 2)
    os._exit(1)


def _build_side(cfg: JobConfig, addresses: list[str], model_dir: str, version: int) -> RolloutSide:
    """The job's rollout side (the child's default build)."""
    from areal_tasks.models.tokenizer import load_tokenizer
    from areal_tasks.rollout.side import RolloutSide

    return RolloutSide.build(cfg, addresses, load_tokenizer(model_dir), version)


def _child_main(conn: Connection, build: Callable[..., Any], args: tuple[Any, ...], parent_pid: int) -> None:
    """The child: build the side, say ready, serve commands until told to close or the pipe ends."""
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        force=True,
        format=f"%(asctime)s [rl rank {rank} rollout] %(levelname)s %(name)s: %(message)s",
    )
    from areal_tasks.quiet_logs import quiet_third_party_loggers

    quiet_third_party_loggers()
    from areal_tasks.trace import configure_from_env, uninstall

    configure_from_env("rollout")
    try:
        side = build(*args)
    except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
        conn.send(("error", _portable(exc)))
        return
    from areal_tasks.gc_heap import freeze_startup_heap

    freeze_startup_heap()  # tokenizer, client, workflows, dataset: never traversed by a collection again
    threading.Thread(target=_watch_parent, args=(parent_pid, side), name="parent-watch", daemon=True).start()
    try:
        conn.send(("ready", side.n_servers))
        while True:
            try:
                message = conn.recv()
            except EOFError:
                logger.warning("the RL worker closed the pipe without saying close: closing the rollout side")
                break
            if message is None:
                break
            name, call_args, call_kwargs = message
            try:
                result = _resolve(side, name)(*call_args, **call_kwargs)
                conn.send(("ok", result if COMMANDS[name] else None))
            except BaseException as exc:  # noqa: BLE001 - sent to the parent, which raises it
                conn.send(("error", _portable(exc)))
    finally:
        try:
            side.close()
        finally:
            conn.close()
            uninstall()  # the spans still buffered go to the part file
