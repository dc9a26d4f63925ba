"""Async saves: a host copy of the state is taken (the trainer waits only for that), then one
background thread writes it while training continues.

Memory stays bounded: at most one save is in flight, and :meth:`AsyncSaver.submit` first waits for
the previous one to finish, so at most one staged copy of the state exists at any time (plus the
one being taken, which replaces it). A failure of a background save is raised to the trainer at the
next :meth:`AsyncSaver.submit` or :meth:`AsyncSaver.wait` -- never lost.

The background writer talks to other ranks only through its own process group (the checkpoint
manager builds a dedicated gloo group), so its collectives never interleave with training ones.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


def stage_state_dict(state: Any) -> Any:
    """A copy of ``state`` (nested dicts/lists of tensors, DTensors and plain values) in host memory.

    DTensors keep their mesh and placements with a cloned local shard; other values are copied, so
    later in-place training updates cannot reach the copy.
    """
    import copy

    import torch
    from torch.distributed.tensor import DTensor

    def clone(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    def walk(value: Any) -> Any:
        if isinstance(value, DTensor):
            if value.device.type != "cpu":
                # a DTensor over the same mesh holding a fresh host copy of the shard (what DCP's own
                # stager does); from_local would move a host shard back to the mesh's device
                return value.detach().to("cpu")
            return DTensor.from_local(
                clone(value.to_local()),
                value.device_mesh,
                value.placements,
                run_check=False,
                shape=value.shape,
                stride=value.stride(),
            )
        if isinstance(value, torch.Tensor):
            return clone(value)
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, tuple):
            return tuple(walk(v) for v in value)
        return copy.deepcopy(value)

    return walk(state)


def state_nbytes(state: Any) -> int:
    """Bytes of the (local) tensors in ``state``."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(state, DTensor):
        local: torch.Tensor = state.to_local()
        return local.numel() * local.element_size()
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_nbytes(v) for v in state)
    return 0


class AsyncSaver:
    """One background worker; at most one job in flight (see the module docstring)."""

    def __init__(self, name: str = "ckpt-save") -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._future: Future[Any] | None = None
        self._lock = threading.Lock()
        #: callers currently blocked in :meth:`submit` waiting for the previous job.
        self.waiting = 0

    @property
    def in_flight(self) -> bool:
        return self._future is not None and not self._future.done()

    def wait(self) -> Any:
        """Block until the in-flight job (if any) is done; re-raise its exception; return its result."""
        future = self._future
        if future is None:
            return None
        self._future = None
        return future.result()

    def submit(self, fn: Callable[[], T], *, before: Callable[[], Any] | None = None) -> Future[T]:
        """Wait for the previous job, run ``before`` (e.g. staging) in the caller, then start ``fn``."""
        with self._lock:
            self.waiting += 1
            try:
                self.wait()
            finally:
                self.waiting -= 1
            if before is not None:
                before()
            future = self._pool.submit(fn)
            self._future = future
            return future

    def close(self) -> None:
        """Wait for the in-flight job and stop the worker (its exception, if any, is raised)."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
