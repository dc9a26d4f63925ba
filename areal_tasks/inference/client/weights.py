"""Weight updates across the fleet: from disk, over a collective group (SGLang's protocol), or
from the trainer's shared-memory buffers on the same host (the embedded server's extension).

Disk: every server loads ``meta.path`` (``/update_weights_from_disk``). Collective: the servers
join the group once per (group name, rendezvous, world size, server list), server ``i`` holding
ranks ``1 + i * ranks_per_server ...``; then, bucket after bucket, every server receives the
bucket's one broadcast (``/update_weights_from_distributed``) while the trainer sends it. Shared:
every server copies from the buffer on its device, laid out as the one "bucket" it is sent. An
adapter may bracket the load calls of one update with a begin and an end call (SGLang:
``/begin_weight_update`` ... ``/end_weight_update`` around a collective update). See
docs/inference.md for the exact bytes the trainer broadcasts.

What differs between the modes on this side is protocol: which adapter call loads, whether the
servers join a group first, whether a load waits for the trainer's broadcast (then ``meta.timeout_s``
bounds it), and what a one-request swap carries. Each mode says that once, in :data:`_MODES`; the
update, the swap and their checks are written once over it. (The sending and receiving of the
bytes are the transports', ``areal_tasks.weights``; this client only makes HTTP calls.)

Teardown: :meth:`WeightSync.destroy_groups` makes every server of each joined group leave it (the
adapter's ``destroy_weight_group``; SGLang ``/destroy_weights_update_group``) and forgets the
group, so a later update with the same name joins afresh. The trainer destroys its side at the
same time (``areal_tasks/weights/group.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from areal_tasks.api.inference import ParamSpec
from areal_tasks.errors import InferenceControlError
from areal_tasks.inference.client.control import fan_out
from areal_tasks.inference.client.protocol import HttpCall, ProtocolAdapter
from areal_tasks.inference.client.transport import HttpTransport

if TYPE_CHECKING:
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = ["WeightSync"]

Buckets = Sequence[Sequence[ParamSpec]]


@dataclass(frozen=True)
class _JoinedGroup:
    """One collective group the servers joined: its name, rendezvous, size and member servers."""

    name: str
    master_addr: str | None
    master_port: int | None
    world_size: int | None
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class _Mode:
    """How the client drives one weight-update mode on every server (see the module doc)."""

    #: the servers join the update's group before their first load of it
    joins_group: bool
    #: a load waits for the trainer's broadcast, so ``meta.timeout_s`` bounds it (else the update timeout)
    waits_for_trainer: bool
    #: ``(meta, buckets) -> the loads' buckets`` (one None for a load without a plan); raises when
    #: the update cannot be made (a plan or buffer missing)
    plan: Callable[[WeightUpdateMeta, Buckets | None], list[Sequence[ParamSpec] | None]]
    #: ``(adapter, meta, bucket, flush_cache) -> the load call``, or None: the backend cannot
    load: Callable[[ProtocolAdapter, WeightUpdateMeta, Sequence[ParamSpec] | None, bool], HttpCall | None]
    #: ``(meta, k, n) -> what load k of n is called`` in errors and logs
    label: Callable[[WeightUpdateMeta, int, int], str]
    #: why a backend whose adapter has no load call refuses the mode, and what to set instead
    refusal: str = "cannot load this kind of weight update"


def _no_plan(meta: WeightUpdateMeta, buckets: Buckets | None) -> list[Sequence[ParamSpec] | None]:
    return [None]


def _collective_plan(meta: WeightUpdateMeta, buckets: Buckets | None) -> list[Sequence[ParamSpec] | None]:
    if buckets is None:
        raise InferenceControlError(
            "a collective weight update needs the bucket plan (plan_weight_buckets) the trainer broadcasts"
        )
    return list(buckets)


def _shared_plan(meta: WeightUpdateMeta, buckets: Buckets | None) -> list[Sequence[ParamSpec] | None]:
    """The one "bucket" of a shared update: the tensors in the order they lie in every buffer."""
    if buckets is None or len(buckets) != 1:
        raise InferenceControlError(
            "a shared weight update needs its layout as exactly one bucket "
            f"(the shared transport's layout), got {buckets!r:.80}"
        )
    if not meta.shared_buffers:
        raise InferenceControlError(
            "a shared weight update names no buffer: pass the shared transport's server_update(meta) "
            "(meta.with_buffers(descriptions)) after the trainer packed"
        )
    return [buckets[0]]


#: mode (``WeightUpdateMeta.type``) -> how the client drives it.
_MODES: dict[str, _Mode] = {
    "disk": _Mode(
        joins_group=False,
        waits_for_trainer=False,
        plan=_no_plan,
        load=lambda adapter, meta, bucket, flush: adapter.update_weights_from_disk(meta, flush_cache=flush),
        label=lambda meta, k, n: f"update_weights_from_disk(version={meta.version}, path={meta.path})",
    ),
    "collective": _Mode(
        joins_group=True,
        waits_for_trainer=True,
        plan=_collective_plan,
        load=lambda adapter, meta, bucket, flush: adapter.update_weights_from_distributed(
            meta, bucket, flush_cache=flush
        ),
        label=lambda meta, k, n: f"update_weights_from_distributed(version={meta.version}, bucket {k + 1}/{n})",
    ),
    "shared": _Mode(
        joins_group=False,
        waits_for_trainer=False,
        plan=_shared_plan,
        load=lambda adapter, meta, bucket, flush: adapter.update_weights_from_shared(meta, bucket, flush_cache=flush),
        label=lambda meta, k, n: f"update_weights_from_shared(version={meta.version})",
        refusal="cannot load weights from shared memory; set rollout.weight_update=disk or collective",
    ),
}


def _mode(meta: WeightUpdateMeta) -> _Mode:
    mode = _MODES.get(meta.type)
    if mode is None:
        raise InferenceControlError(f"no client support for {meta.type!r} weight updates (known: {sorted(_MODES)})")
    return mode


class WeightSync:
    """Drives one weight update on every server; remembers which collective groups exist."""

    def __init__(
        self, transport: HttpTransport, adapter: ProtocolAdapter, ranks_per_server: int, update_timeout_s: float
    ) -> None:
        self._transport = transport
        self._adapter = adapter
        self._ranks_per_server = ranks_per_server
        self._update_timeout_s = update_timeout_s
        self._groups: set[_JoinedGroup] = set()

    @property
    def group_names(self) -> list[str]:
        """Names of the collective groups the servers were made to join (and not yet to leave)."""
        return sorted({group.name for group in self._groups})

    async def destroy_groups(self, timeout_s: float, group_name: str | None = None) -> list[str]:
        """Make every server leave each joined group (or only ``group_name``); returns the names left.

        Each group is forgotten whatever its servers answer (the trainer's side is gone with it),
        so the next update of that name joins again. Groups of a backend without a leave call
        (vLLM) are only forgotten. Raises InferenceControlError naming every server that failed,
        after trying all groups.
        """
        groups = sorted((g for g in self._groups if group_name is None or g.name == group_name), key=repr)
        failures: list[str] = []
        for group in groups:
            self._groups.discard(group)
            name, addresses = group.name, list(group.addresses)
            call = self._adapter.destroy_weight_group(name)
            if call is None:
                logger.info(
                    "%s servers have no call to leave weight-update group %s; forgetting it", self._adapter.name, name
                )
                continue
            try:
                await fan_out(
                    self._transport,
                    self._adapter,
                    addresses,
                    lambda i, a, call=call: call,
                    timeout_s,
                    f"destroy_weights_update_group({name})",
                )
            except InferenceControlError as exc:
                failures.append(str(exc))
            else:
                logger.info("%d servers left weight-update group %s", len(addresses), name)
        if failures:
            raise InferenceControlError("; ".join(failures))
        return [group.name for group in groups]

    async def update(
        self,
        addresses: Sequence[str],
        meta: WeightUpdateMeta,
        buckets: Buckets | None,
        *,
        flush_cache: bool = True,
    ) -> None:
        """Apply ``meta`` on every server (raises InferenceControlError if any server fails).

        ``flush_cache``: whether the servers drop their KV cache with the update (False while
        sequences paused ``retract``/``in_place`` still hold KV from the old weights)."""
        mode = _mode(meta)
        plan = mode.plan(meta, buckets)
        calls = [mode.load(self._adapter, meta, bucket, flush_cache) for bucket in plan]
        if any(call is None for call in calls):
            raise InferenceControlError(f"{self._adapter.name} servers {mode.refusal}")
        if mode.joins_group:
            await self._ensure_group(addresses, meta)
        await self._bracket(addresses, meta, self._adapter.begin_weight_update(meta), "begin_weight_update")
        timeout = meta.timeout_s if mode.waits_for_trainer else self._update_timeout_s
        for k, call in enumerate(calls):
            await fan_out(
                self._transport,
                self._adapter,
                addresses,
                lambda i, a, call=call: call,
                timeout,
                mode.label(meta, k, len(calls)),
            )
        await self._bracket(addresses, meta, self._adapter.end_weight_update(meta), "end_weight_update")
        logger.info(
            "%s update to version %d: %d loads on %d servers", meta.type, meta.version, len(calls), len(addresses)
        )

    def swap_call(
        self, meta: WeightUpdateMeta, buckets: Buckets | None, mode: str, *, flush_cache: bool
    ) -> HttpCall | None:
        """The adapter's one-request swap for this update, or None (none for this backend, or an
        update of several loads, a collective one of several buckets: those go bucket by bucket).
        Raises InferenceControlError, before any server is called, when the update lacks its plan
        or buffers."""
        kind = _mode(meta)
        plan = kind.plan(meta, buckets)
        load = kind.load(self._adapter, meta, plan[0], flush_cache) if len(plan) == 1 else None
        return None if load is None else self._adapter.swap_weights(meta, load, mode)  # type: ignore[arg-type]

    async def swap(self, addresses: Sequence[str], meta: WeightUpdateMeta, call: HttpCall) -> list[dict[str, float]]:
        """Send ``call`` (:meth:`swap_call`'s) to every server, joining a collective group first;
        returns each server's timings. Raises InferenceControlError if any server fails; every
        server resumed either way (one whose load failed serves on with its old weights and
        version, the others with the new ones)."""
        mode = _mode(meta)
        if mode.joins_group:
            await self._ensure_group(addresses, meta)
        payloads = await fan_out(
            self._transport,
            self._adapter,
            addresses,
            lambda i, a: call,
            meta.timeout_s if mode.waits_for_trainer else self._update_timeout_s,
            f"swap_weights(version={meta.version}, {meta.type})",
        )
        return [dict(p.get("timings", {})) if isinstance(p, dict) else {} for p in payloads]

    async def _bracket(
        self, addresses: Sequence[str], meta: WeightUpdateMeta, call: HttpCall | None, what: str
    ) -> None:
        """Send the adapter's begin/end call of an update to every server (nothing when it has none)."""
        if call is not None:
            await fan_out(
                self._transport,
                self._adapter,
                addresses,
                lambda i, a: call,
                self._update_timeout_s,
                f"{what}(version={meta.version})",
            )

    async def _ensure_group(self, addresses: Sequence[str], meta: WeightUpdateMeta) -> None:
        key = _JoinedGroup(meta.group_name, meta.master_addr, meta.master_port, meta.world_size, tuple(addresses))
        if key in self._groups:
            return
        expected = 1 + len(addresses) * self._ranks_per_server
        if meta.world_size != expected:
            raise InferenceControlError(
                f"weight-update group {meta.group_name!r}: world_size={meta.world_size}, but 1 trainer rank + "
                f"{len(addresses)} servers x {self._ranks_per_server} ranks = {expected}"
            )
        await fan_out(
            self._transport,
            self._adapter,
            addresses,
            lambda i, a: self._adapter.init_weight_group(meta, 1 + i * self._ranks_per_server),
            meta.timeout_s,
            f"init_weights_update_group({meta.group_name}@{meta.master_addr}:{meta.master_port})",
        )
        self._groups.add(key)
