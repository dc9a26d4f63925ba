"""Trainer side of SGLang's collective weight update: join the group, broadcast planned buckets.

One protocol, SGLang 0.5.23's (``docs/inference.md``, "Collective weight updates"), spoken to SGLang
servers and to the embedded server alike:

* **Group.** :func:`init_custom_process_group` is SGLang's function of that name
  (``sglang/srt/utils/common.py``) for a ``tcp://`` init method: torch's TCP rendezvous (rank 0
  hosts the store), the store wrapped in ``PrefixStore(group_name)``, then torch's own
  ``_new_process_group_helper``. The trainer joins as rank 0 (:func:`join_weight_group`) while the
  client's ``/init_weights_update_group`` makes every server join with ranks
  ``rank_offset + tp_rank``; the embedded server's receive side calls the same function.
* **Buckets.** Both the trainer and the client split the weights with the shared
  :func:`~areal_tasks.api.inference.plan_weight_buckets` over the same :class:`ParamSpec` list
  (names, dtypes and shapes in the order the trainer streams the tensors), so they agree on every
  bucket without a header on the wire.
* **Wire.** Per bucket, exactly one ``broadcast(src=0)`` of a ``uint8`` tensor: the bucket's tensors'
  bytes back to back in the bucket's order (what a server allocates for
  ``/update_weights_from_distributed`` with ``load_format="flattened_bucket"``). No header, no end
  marker, no version on the wire: the version travels over HTTP (``weight_version``).
* **Teardown.** Every member leaves together, as they joined: the trainer destroys its side
  (:meth:`WeightGroup.destroy`) while the client's ``/destroy_weights_update_group`` makes every
  server destroy its own. With NCCL a member's destroy can wait for its peers, so both sides use
  :func:`leave_process_group`: ``destroy_process_group`` bounded by a timeout
  (:data:`GROUP_DESTROY_TIMEOUT_S`), after which the group is aborted locally
  (:func:`abort_process_group`) and a warning names it, instead of hanging when a peer is gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = [
    "GROUP_DESTROY_TIMEOUT_S",
    "BucketedBroadcastSender",
    "WeightGroup",
    "abort_process_group",
    "bucket_views",
    "check_bucket_tensor",
    "flatten_bucket",
    "init_custom_process_group",
    "join_weight_group",
    "leave_process_group",
    "spec_of",
]

#: seconds a member waits for ``destroy_process_group`` of a weight-update group before aborting it.
GROUP_DESTROY_TIMEOUT_S = 30.0
#: seconds an abort may take before the group is left to the process's exit.
_ABORT_TIMEOUT_S = 10.0


def init_custom_process_group(
    backend: str,
    master_addr: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta,
) -> Any:
    """Build a weight-update group the way SGLang's servers do (TCP rendezvous at ``master_addr:master_port``).

    Returns the new ``ProcessGroup`` (not torch's default group); blocks until all ``world_size``
    members have joined. Both sides of a weight update must build the group this way, or the
    rendezvous keys do not meet.
    """
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _new_process_group_helper, _world, rendezvous

    host = f"[{master_addr}]" if ":" in master_addr else master_addr
    store, rank, world_size = next(rendezvous(f"tcp://{host}:{master_port}", rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], dist.Backend(backend), store, group_name=group_name, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


@dataclass
class WeightGroup:
    """The trainer's (rank 0) membership of one weight-update group."""

    name: str
    world_size: int
    backend: str
    device: torch.device
    process_group: Any

    def broadcast(self, flat: torch.Tensor) -> None:
        """Broadcast ``flat`` from rank 0 (this process) to every server rank; blocks until sent."""
        import torch.distributed as dist

        dist.broadcast(flat, src=0, group=self.process_group)

    def destroy(self, timeout_s: float = GROUP_DESTROY_TIMEOUT_S) -> bool:
        """Leave the group, bounded (:func:`leave_process_group`); True when it was destroyed cleanly.

        Only this side: run it while the servers leave through ``/destroy_weights_update_group``
        (the client's ``destroy_weight_groups``), or with NCCL it waits for them until the bound.
        """
        return leave_process_group(self.process_group, self.name, timeout_s)


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
        lambda: abort_process_group(process_group), f"abort-{group_name}", _ABORT_TIMEOUT_S
    )
    if not aborted:
        logger.warning(
            "weight-update group %s: abort did not return within %.0f s either; it ends with the process",
            group_name,
            _ABORT_TIMEOUT_S,
        )
    elif abort_error is not None and not isinstance(abort_error, ValueError):  # ValueError: gone already
        logger.warning("weight-update group %s: abort failed: %r", group_name, abort_error)
    return False


def join_weight_group(meta: WeightUpdateMeta) -> WeightGroup:
    """Join the group ``meta`` names as rank 0 (hosting its rendezvous); blocks until all joined.

    Run it concurrently with the client's ``/init_weights_update_group`` calls (the client's first
    collective ``update_weights`` of that group makes them).
    """
    import torch

    if meta.type != "collective":
        raise EngineError(f"join_weight_group needs a collective WeightUpdateMeta, got type={meta.type!r}")
    if meta.backend == "nccl":
        if not torch.cuda.is_available():
            raise EngineError("backend='nccl' needs CUDA; use backend='gloo' on CPU")
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    assert meta.master_addr is not None and meta.master_port is not None and meta.world_size is not None
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
    return WeightGroup(meta.group_name, meta.world_size, meta.backend, device, pg)


def spec_of(name: str, tensor: torch.Tensor) -> ParamSpec:
    """The :class:`ParamSpec` of one tensor (works on ``meta``-device tensors too)."""
    return ParamSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))


def bucket_views(flat: torch.Tensor, bucket: Sequence[ParamSpec]) -> dict[str, torch.Tensor]:
    """The slices of the ``uint8`` tensor ``flat`` that hold ``bucket``'s tensors back to back, by
    name, each viewed in its spec's dtype and shape (no copy). ``flat`` must hold exactly the
    bucket's bytes (:class:`EngineError` otherwise)."""
    import torch

    nbytes = sum(spec.nbytes for spec in bucket)
    if flat.numel() != nbytes:
        raise EngineError(f"the flat tensor holds {flat.numel()} bytes, the bucket's {len(bucket)} tensors {nbytes}")
    views, offset = {}, 0
    for spec in bucket:
        views[spec.name] = flat[offset : offset + spec.nbytes].view(getattr(torch, spec.dtype)).view(spec.shape)
        offset += spec.nbytes
    return views


def check_bucket_tensor(spec: ParamSpec, tensor: torch.Tensor) -> None:
    """Raise :class:`EngineError` unless ``tensor`` can fill ``spec``'s slice: the same shape, and
    the same dtype or a floating-point one the copy casts to the spec's floating-point dtype."""
    import torch

    wire_dtype = getattr(torch, spec.dtype)
    castable = tensor.is_floating_point() and wire_dtype.is_floating_point
    if tuple(tensor.shape) != spec.shape or (tensor.dtype != wire_dtype and not castable):
        raise EngineError(f"{spec.name}: tensor is {spec_of(spec.name, tensor)}, the bucket plan says {spec}")


def flatten_bucket(
    bucket: Sequence[ParamSpec], tensors: Mapping[str, torch.Tensor], device: torch.device
) -> torch.Tensor:
    """One bucket's wire tensor: the bytes of ``tensors[spec.name]`` back to back, in ``bucket`` order.

    The wire tensor is allocated once and every tensor is copied straight into its slice
    (:func:`bucket_views`); a floating-point tensor is cast to its spec's floating-point dtype by
    that copy (the trainer's fp32 master weights go out as bf16 without a cast copy first). Raises
    :class:`EngineError` when a tensor is missing, has another shape, or has another dtype that is
    not such a cast (:func:`check_bucket_tensor`).
    """
    import torch

    flat = torch.empty(sum(spec.nbytes for spec in bucket), dtype=torch.uint8, device=device)
    views = bucket_views(flat, bucket)
    for spec in bucket:
        tensor = tensors.get(spec.name)
        if tensor is None:
            raise EngineError(f"weight bucket names {spec.name!r}, but no such tensor was given")
        check_bucket_tensor(spec, tensor)
        views[spec.name].copy_(tensor.detach())
    return flat


class BucketedBroadcastSender:
    """Rank 0: sends named tensors as the planned buckets of one update (see the module doc)."""

    def __init__(self, group: WeightGroup, bucket_bytes: int) -> None:
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise EngineError(f"bucket_bytes must be an int >= 1, got {bucket_bytes!r}")
        self.group = group
        self.bucket_bytes = bucket_bytes

    def plan(self, specs: Sequence[ParamSpec]) -> list[list[ParamSpec]]:
        """The buckets of ``specs``: the plan the client posts to the servers for the same specs."""
        return plan_weight_buckets(specs, self.bucket_bytes)

    def send_packed(self, flats: Sequence[torch.Tensor]) -> int:
        """Broadcast buckets packed earlier (:func:`flatten_bucket` of each planned bucket, in
        order); returns bytes sent."""
        import time

        started = time.perf_counter()
        for flat in flats:
            self.group.broadcast(flat)
        total = sum(flat.numel() for flat in flats)
        logger.info(
            "broadcast %d packed buckets, %d bytes, over %s in %.1f ms (host time)",
            len(flats),
            total,
            self.group.name,
            1e3 * (time.perf_counter() - started),
        )
        return total

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], specs: Sequence[ParamSpec]) -> int:
        """Broadcast ``named_tensors`` (streamed in ``specs`` order) bucket by bucket; returns bytes sent.

        Holds at most one bucket's tensors at a time; floating-point tensors may come in another
        floating-point dtype than their spec's and are cast on the way (:func:`flatten_bucket`).
        Raises :class:`EngineError` when the stream differs from ``specs`` (a name, dtype or shape,
        or the number of tensors).
        """
        import time

        started = time.perf_counter()
        packing = 0.0
        stream = iter(named_tensors)
        total = 0
        buckets = self.plan(specs)
        for bucket in buckets:
            packed_from = time.perf_counter()
            wanted = {spec.name for spec in bucket}
            held: dict[str, torch.Tensor] = {}
            for _ in bucket:  # a bucket is a run of consecutive specs, so of consecutive tensors
                name, tensor = next(stream, (None, None))
                if name is None:
                    raise EngineError(f"weight stream ended before the planned tensors {sorted(wanted - set(held))}")
                if name not in wanted:
                    raise EngineError(f"weight stream gave {name!r} where the plan expects one of {sorted(wanted)}")
                held[name] = tensor
            flat = flatten_bucket(bucket, held, self.group.device)
            packing += time.perf_counter() - packed_from
            self.group.broadcast(flat)
            total += flat.numel()
        extra = next(stream, None)
        if extra is not None:
            raise EngineError(f"weight stream has tensor {extra[0]!r} beyond the {len(specs)} planned ones")
        logger.info(
            "broadcast %d buckets, %d bytes, over %s in %.1f ms (gather and pack %.1f ms, host time)",
            len(buckets),
            total,
            self.group.name,
            1e3 * (time.perf_counter() - started),
            1e3 * packing,
        )
        return total
