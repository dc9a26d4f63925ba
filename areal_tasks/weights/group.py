"""The process group of a collective weight update, built and left the way SGLang's servers do.

* **Join.** :func:`init_custom_process_group` is SGLang's function of that name
  (``sglang/srt/utils/common.py``) for a ``tcp://`` init method: torch's TCP rendezvous (rank 0
  hosts the store), the store wrapped in ``PrefixStore(group_name)``, then torch's own
  ``_new_process_group_helper``. Both ends call it: the trainer as rank 0
  (:func:`join_as_trainer`), every server rank as ``rank_offset + tp_rank``
  (:func:`join_as_server`; the embedded server and the vLLM plugin), so the rendezvous keys meet
  whatever SGLang-compatible peer is on the other side.
* **Leave.** Every member leaves together, as they joined: the trainer destroys its side while the
  client's ``/destroy_weights_update_group`` makes every server destroy its own. With NCCL a
  member's destroy can wait for its peers, so both sides use :func:`leave_process_group`:
  ``destroy_process_group`` bounded by a timeout (:data:`GROUP_DESTROY_TIMEOUT_S`), after which the
  group is aborted locally (:func:`abort_process_group`) and a warning names it, instead of hanging
  when a peer is gone.

Torch is imported inside the functions: the module imports without it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import WeightTransportError
from areal_tasks.weights.base import on_device

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = [
    "GROUP_ABORT_TIMEOUT_S",
    "GROUP_DESTROY_TIMEOUT_S",
    "WeightGroup",
    "abort_process_group",
    "init_custom_process_group",
    "join_as_server",
    "join_as_trainer",
    "leave_process_group",
]

#: seconds a member waits for ``destroy_process_group`` of a weight-update group before aborting it.
GROUP_DESTROY_TIMEOUT_S = 30.0
#: seconds an abort may take before the group is left to the process's exit (a leave takes at
#: most its destroy timeout plus this).
GROUP_ABORT_TIMEOUT_S = 10.0


def init_custom_process_group(
    backend: str,
    master_addr: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta,
    rendezvous_timeout: timedelta | None = None,
) -> Any:
    """Build a weight-update group the way SGLang's servers do (TCP rendezvous at ``master_addr:master_port``).

    Returns the new ``ProcessGroup`` (not torch's default group); blocks until all ``world_size``
    members have joined. Both sides of a weight update must build the group this way, or the
    rendezvous keys do not meet. ``timeout`` bounds the group's operations (a broadcast that never
    comes); ``rendezvous_timeout`` (default ``timeout``) how long a member retries reaching the
    store at ``master_addr:master_port``. A peer that accepts the connection but never answers
    holds the caller past either (torch's store client waits for its handshake without a
    deadline): run the join where a stuck thread is bounded and reported (the server's lanes).
    """
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _new_process_group_helper, _world, rendezvous

    host = f"[{master_addr}]" if ":" in master_addr else master_addr
    store, rank, world_size = next(
        rendezvous(f"tcp://{host}:{master_port}", rank, world_size, timeout=rendezvous_timeout or timeout)
    )
    store.set_timeout(timeout)
    store = dist.PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], dist.Backend(backend), store, group_name=group_name, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


@dataclass
class WeightGroup:
    """One member's (trainer rank 0 or a server rank) membership of one weight-update group."""

    name: str
    rank: int
    world_size: int
    backend: str
    device: torch.device
    process_group: Any

    def broadcast(self, flat: torch.Tensor) -> None:
        """Broadcast ``flat`` from rank 0 (the trainer) to every server rank; blocks until sent."""
        import torch.distributed as dist

        dist.broadcast(flat, src=0, group=self.process_group)

    def destroy(self, timeout_s: float | None = None) -> bool:
        """Leave the group, bounded (:func:`leave_process_group`, ``timeout_s`` defaulting to
        :data:`GROUP_DESTROY_TIMEOUT_S`); True when it was destroyed cleanly.

        Only this side: run it while the other members leave theirs (the client's
        ``destroy_weight_groups`` while the trainer destroys its own), or with NCCL it waits for
        them until the bound.
        """
        return leave_process_group(
            self.process_group, self.name, GROUP_DESTROY_TIMEOUT_S if timeout_s is None else timeout_s
        )


def abort_process_group(process_group: Any) -> None:
    """Abort ``process_group`` locally, without waiting for its other members.

    torch (2.13) has no public API for this: ``torch.distributed.distributed_c10d._abort_process_group``
    is the private one (``ProcessGroup.abort()`` plus the book-keeping ``destroy_process_group``
    does). This wrapper is the one place that names it. Raises ``ValueError`` when the group is
    not registered any more (destroyed or aborted already).
    """
    from torch.distributed import distributed_c10d

    distributed_c10d._abort_process_group(process_group)


def _in_thread(fn: Any, name: str, timeout_s: float) -> tuple[bool, BaseException | None]:
    """Run ``fn()`` in a daemon thread; ``(finished within timeout_s, its exception or None)``."""
    done = threading.Event()
    error: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            error.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    finished = done.wait(timeout_s)
    return finished, (error[0] if error else None)


def leave_process_group(process_group: Any, group_name: str, timeout_s: float = GROUP_DESTROY_TIMEOUT_S) -> bool:
    """``destroy_process_group(process_group)``, but never forever; True when it returned cleanly.

    The destroy runs in a daemon thread. When it has not returned after ``timeout_s`` (a member
    that never leaves: a server that is gone or was never told to leave) or it failed, a warning
    names ``group_name`` and the group is aborted locally (:func:`abort_process_group`, itself
    bounded); a destroy still stuck then is left to end with the process. Never raises.
    """
    import torch.distributed as dist

    finished, error = _in_thread(lambda: dist.destroy_process_group(process_group), f"destroy-{group_name}", timeout_s)
    if finished and error is None:
        logger.info("left weight-update group %s", group_name)
        return True
    if finished:
        logger.warning("destroying weight-update group %s failed (%r); aborting it", group_name, error)
    else:
        logger.warning(
            "weight-update group %s: destroy did not return within %.0f s (a member did not leave); "
            "aborting the group locally",
            group_name,
            timeout_s,
        )
    aborted, abort_error = _in_thread(
        lambda: abort_process_group(process_group), f"abort-{group_name}", GROUP_ABORT_TIMEOUT_S
    )
    if not aborted:
        logger.warning(
            "weight-update group %s: abort did not return within %.0f s either; it ends with the process",
            group_name,
            GROUP_ABORT_TIMEOUT_S,
        )
    elif abort_error is not None and not isinstance(abort_error, ValueError):  # ValueError: gone already
        logger.warning("weight-update group %s: abort failed: %r", group_name, abort_error)
    return False


def join_as_trainer(meta: WeightUpdateMeta, device: torch.device) -> WeightGroup:
    """Join the group ``meta`` names as rank 0 (hosting its rendezvous); blocks until all joined.

    ``device`` is where the broadcast buckets live: the current CUDA device for ``nccl``, the CPU
    for ``gloo``. Run it concurrently with the client's ``/init_weights_update_group`` calls (the
    client's first collective update of that group makes them).
    """
    if meta.master_addr is None or meta.master_port is None or meta.world_size is None:
        raise WeightTransportError(
            f"joining a weight-update group needs a collective WeightUpdateMeta (rendezvous and world "
            f"size), got type={meta.type!r}"
        )
    pg = init_custom_process_group(
        meta.backend,
        meta.master_addr,
        meta.master_port,
        meta.world_size,
        0,
        meta.group_name,
        timedelta(seconds=meta.timeout_s),
    )
    logger.info("joined weight-update group %s as rank 0 of %d (%s)", meta.group_name, meta.world_size, meta.backend)
    return WeightGroup(meta.group_name, 0, meta.world_size, meta.backend, device, pg)


def join_as_server(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    device: torch.device,
    timeout_s: float = 1800.0,
    rendezvous_timeout_s: float | None = None,
) -> WeightGroup:
    """Join as server rank ``rank`` the way SGLang's ``init_custom_process_group`` does (blocks
    until every member joined); refuses settings the group cannot work with, naming them.
    ``timeout_s`` bounds the group's operations, ``rendezvous_timeout_s`` (default ``timeout_s``)
    reaching the trainer's store (:func:`init_custom_process_group`)."""
    if not group_name:
        raise WeightTransportError("group_name must not be empty")
    if backend not in ("gloo", "nccl"):
        raise WeightTransportError(f"backend must be gloo or nccl, got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise WeightTransportError("backend nccl needs the server to run on CUDA; use gloo on CPU")
    if not 0 < rank < world_size:
        raise WeightTransportError(f"rank {rank} must be in 1..{world_size - 1} (rank 0 is the trainer)")
    with on_device(device):
        pg = init_custom_process_group(
            backend,
            master_address,
            master_port,
            world_size,
            rank,
            group_name,
            timedelta(seconds=timeout_s),
            None if rendezvous_timeout_s is None else timedelta(seconds=rendezvous_timeout_s),
        )
    logger.info("joined weight-update group %s as rank %d of %d (%s)", group_name, rank, world_size, backend)
    return WeightGroup(group_name, rank, world_size, backend, device, pg)
