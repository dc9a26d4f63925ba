"""Weight updates across the fleet: from disk, over a collective group (SGLang's protocol), or
from the trainer's shared-memory buffers on the same host (the embedded server's extension).

Disk: every server loads ``meta.path`` (``/update_weights_from_disk``). Collective: the servers
join the group once per (group name, rendezvous, world size, server list), server ``i`` holding
ranks ``1 + i * ranks_per_server ...``; then, bucket after bucket, every server receives the
bucket's one broadcast (``/update_weights_from_distributed``) while the trainer sends it. An
adapter may bracket the load calls of one update with a begin and an end call (SGLang:
``/begin_weight_update`` ... ``/end_weight_update`` around a collective update). See
docs/inference.md for the exact bytes the trainer broadcasts.

Teardown: :meth:`WeightSync.destroy_groups` makes every server of each joined group leave it (the
adapter's ``destroy_weight_group``; SGLang ``/destroy_weights_update_group``) and forgets the
group, so a later update with the same name joins afresh. The trainer destroys its side at the
same time (``engine/weights/collective.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
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


@dataclass(frozen=True)
class _JoinedGroup:
    """One collective group the servers joined: its name, rendezvous, size and member servers."""

    name: str
    master_addr: str | None
    master_port: int | None
    world_size: int | None
    addresses: tuple[str, ...]


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
        buckets: Sequence[Sequence[ParamSpec]] | None,
        *,
        flush_cache: bool = True,
    ) -> None:
        """Apply ``meta`` on every server (raises InferenceControlError if any server fails).

        ``flush_cache``: whether the servers drop their KV cache with the update (False while
        sequences paused ``retract``/``in_place`` still hold KV from the old weights)."""
        if meta.type == "disk":
            await self._bracket(addresses, meta, self._adapter.begin_weight_update(meta), "begin_weight_update")
            await fan_out(
                self._transport,
                self._adapter,
                addresses,
                lambda i, a: self._adapter.update_weights_from_disk(meta, flush_cache=flush_cache),
                self._update_timeout_s,
                f"update_weights_from_disk(version={meta.version}, path={meta.path})",
            )
            await self._bracket(addresses, meta, self._adapter.end_weight_update(meta), "end_weight_update")
            return
        if meta.type == "shared":
            await self._update_shared(addresses, meta, buckets, flush_cache)
            return
        if buckets is None:
            raise InferenceControlError(
                "a collective weight update needs the bucket plan (plan_weight_buckets) the trainer broadcasts"
            )
        await self._ensure_group(addresses, meta)
        await self._bracket(addresses, meta, self._adapter.begin_weight_update(meta), "begin_weight_update")
        for k, bucket in enumerate(buckets):
            await fan_out(
                self._transport,
                self._adapter,
                addresses,
                lambda i, a, bucket=bucket: self._adapter.update_weights_from_distributed(
                    meta, bucket, flush_cache=flush_cache
                ),
                meta.timeout_s,
                f"update_weights_from_distributed(version={meta.version}, bucket {k + 1}/{len(buckets)})",
            )
        await self._bracket(addresses, meta, self._adapter.end_weight_update(meta), "end_weight_update")
        logger.info(
            "collective update to version %d: %d buckets on %d servers", meta.version, len(buckets), len(addresses)
        )

    async def _update_shared(
        self,
        addresses: Sequence[str],
        meta: WeightUpdateMeta,
        buckets: Sequence[Sequence[ParamSpec]] | None,
        flush_cache: bool,
    ) -> None:
        layout = _shared_layout(meta, buckets)
        call = self._adapter.update_weights_from_shared(meta, layout, flush_cache=flush_cache)
        if call is None:
            raise InferenceControlError(
                f"{self._adapter.name} servers cannot load weights from shared memory; "
                "set rollout.weight_update=disk or collective"
            )
        await fan_out(
            self._transport,
            self._adapter,
            addresses,
            lambda i, a: call,
            self._update_timeout_s,
            f"update_weights_from_shared(version={meta.version})",
        )

    def swap_call(
        self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None, mode: str, *, flush_cache: bool
    ) -> HttpCall | None:
        """The adapter's one-request swap for this update, or None (none for this backend, or a
        collective update of several buckets: those go bucket by bucket)."""
        if meta.type == "shared":
            return self._adapter.swap_weights(meta, _shared_layout(meta, buckets), mode, flush_cache=flush_cache)
        if meta.type == "collective" and (buckets is None or len(buckets) != 1):
            return None
        bucket = buckets[0] if meta.type == "collective" and buckets is not None else None
        return self._adapter.swap_weights(meta, bucket, mode, flush_cache=flush_cache)  # type: ignore[arg-type]

    async def swap(self, addresses: Sequence[str], meta: WeightUpdateMeta, call: HttpCall) -> list[dict[str, float]]:
        """Send ``call`` (:meth:`swap_call`'s) to every server, joining a collective group first;
        returns each server's timings. Raises InferenceControlError if any server fails."""
        if meta.type == "collective":
            await self._ensure_group(addresses, meta)
        timeout = meta.timeout_s if meta.type == "collective" else self._update_timeout_s
        payloads = await fan_out(
            self._transport,
            self._adapter,
            addresses,
            lambda i, a: call,
            timeout,
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


def _shared_layout(meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None) -> Sequence[ParamSpec]:
    """The one "bucket" of a shared update: the tensors in the order they lie in every buffer."""
    if buckets is None or len(buckets) != 1:
        raise InferenceControlError(
            "a shared weight update needs its layout as exactly one bucket "
            f"(engine/weights/shared.py shared_layout), got {buckets!r:.80}"
        )
    if not meta.shared_buffers:
        raise InferenceControlError(
            "a shared weight update names no buffer: pass "
            "meta.with_buffers(engine.shared_weight_buffers()) after the trainer packed"
        )
    return buckets[0]
