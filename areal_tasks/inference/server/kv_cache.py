"""Slot KV cache: every running sequence owns one slot holding its keys and values for every layer.

Storage per attention layer is one tensor of shape ``[2, slots, kv_heads, max_len, head_dim]``
(keys, then values; ``keys[layer]`` and ``values[layer]`` are its two halves, so a captured decode
step writes both with one kernel), allocated on the first write (the warm-up forward at start-up), so any model whose
attention goes through ``Cache.update`` works without reading head counts from its config.
Slots are handed out lowest first and the engine keeps running sequences in slots ``0..B-1``
(:meth:`SlotKVCache.move_many`), so a decode step reads one contiguous view instead of gathering.

:class:`BatchCacheView` is the ``transformers`` ``Cache`` handed to one forward pass: its
``update`` writes the step's new keys/values into each row's slot at that row's positions and
returns the keys/values the rows attend to: for a prefill from position 0 the new ones
themselves, otherwise the rows' slots up to the longest filled length of the batch (the attention
mask built by the model runner hides each row's unfilled tail).
"""

from __future__ import annotations

import heapq
import logging

import torch
from transformers.cache_utils import Cache

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.transfer import host_to_device

logger = logging.getLogger(__name__)


class SlotKVCache:
    """Fixed-size pool of per-sequence KV slots."""

    def __init__(self, num_slots: int, max_len: int, device: torch.device) -> None:
        if num_slots < 1 or max_len < 2:
            raise InferenceError(f"KV cache needs num_slots >= 1 and max_len >= 2, got {num_slots}, {max_len}")
        self.num_slots = num_slots
        self.max_len = max_len
        self.device = device
        #: per layer: [2, slots, kv_heads, max_len, head_dim], keys then values.
        self.kv: dict[int, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        #: tokens whose keys/values are stored, per slot.
        self.lengths = [0] * num_slots
        self._free = list(range(num_slots))  # a min-heap: the lowest free slot first

    # ---- slot pool ----
    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """Take a free slot (its length starts at 0); raises when none is left."""
        if not self._free:
            raise InferenceError("KV cache has no free slot")
        slot = heapq.heappop(self._free)
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Give ``slot`` back to the pool."""
        if slot in self._free:
            raise InferenceError(f"KV slot {slot} released twice")
        self.lengths[slot] = 0
        heapq.heappush(self._free, slot)

    def free_slot_ids(self) -> list[int]:
        """The free slots (any order)."""
        return list(self._free)

    def move_many(self, moves: list[tuple[int, int]]) -> None:
        """Move several slots at once (``(src, dst)`` pairs, every ``dst`` free and distinct, no slot
        both a source and a destination): one indexed copy per layer and tensor for all of them,
        instead of two slice copies per layer and move."""
        if not moves:
            return
        sources, targets = [s for s, _ in moves], [d for _, d in moves]
        free = set(self._free)
        if len(set(targets)) != len(moves) or not set(targets) <= free:
            raise InferenceError(f"invalid KV slot moves {moves}: the targets must be distinct free slots")
        if len(set(sources)) != len(moves) or set(sources) & free:
            raise InferenceError(f"invalid KV slot moves {moves}: the sources must be distinct slots in use")
        length = max(self.lengths[s] for s in sources)
        if length > 0:
            src = host_to_device(sources, torch.long, self.device)
            dst = host_to_device(targets, torch.long, self.device)
            for store in self.kv.values():
                store[:, dst, :, :length] = store[:, src, :, :length]
        self._free = [slot for slot in self._free if slot not in targets]
        heapq.heapify(self._free)
        for source, target in moves:
            self.lengths[target] = self.lengths[source]
            self.release(source)

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""
        if length > self.lengths[src]:
            raise InferenceError(f"slot {src} holds {self.lengths[src]} positions, cannot copy {length}")
        for layer in self.keys:
            self.keys[layer][dst, :, :length] = self.keys[layer][src, :, :length]
            self.values[layer][dst, :, :length] = self.values[layer][src, :, :length]
        self.lengths[dst] = length

    def clear(self) -> None:
        """Zero the storage in place (``/flush_cache`` on an idle server; addresses stay valid for
        captured CUDA graphs)."""
        if len(self._free) != self.num_slots:
            raise InferenceError("cannot clear the KV cache while slots are in use")
        for tensor in self.kv.values():
            tensor.zero_()

    # ---- usage figures ----
    @property
    def used_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def capacity_tokens(self) -> int:
        return self.num_slots * self.max_len

    @property
    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv.values())

    # ---- storage ----
    def _ensure_layer(self, layer: int, like: torch.Tensor) -> None:
        if layer in self.keys:
            return
        _, kv_heads, _, head_dim = like.shape
        shape = (2, self.num_slots, kv_heads, self.max_len, head_dim)
        self.kv[layer] = torch.zeros(shape, dtype=like.dtype, device=self.device)
        self.keys[layer], self.values[layer] = self.kv[layer].unbind(0)
        if layer == 0:
            logger.info(
                "KV cache: %d slots x %d positions, %d kv heads x %d dims, %s",
                self.num_slots,
                self.max_len,
                kv_heads,
                head_dim,
                like.dtype,
            )

    def layer_kv(self, layer: int, like: torch.Tensor) -> torch.Tensor:
        """The joint storage [2, slots, kv_heads, max_len, head_dim] of ``layer`` (allocated like
        ``like`` on first use)."""
        self._ensure_layer(layer, like)
        return self.kv[layer]

    def layer(self, layer: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V storage of ``layer`` (allocated like ``like`` [B, kv_heads, T, head_dim] on first use)."""
        self._ensure_layer(layer, like)
        return self.keys[layer], self.values[layer]


class BatchCacheView(Cache):
    """The ``Cache`` of one forward pass over some slots (see the module doc).

    ``start[b]`` is row ``b``'s first new position; a forward of T > 1 tokens per row is a prefill
    from position 0 (several rows, right-padded) or from ``start`` (one row).
    """

    def __init__(self, store: SlotKVCache, slots: list[int], start: list[int], kv_len: int) -> None:
        super().__init__(layers=[])
        self.store = store
        self.slot_list = slots
        self.start = start
        self.kv_len = kv_len
        self.contiguous = slots == list(range(len(slots)))
        self.slots = host_to_device(slots, torch.long, store.device)
        self.positions = host_to_device(start, torch.long, store.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        k_store, v_store = self.store.layer(layer_idx, key_states)
        batch, _, steps, _ = key_states.shape
        if batch == 1:
            slot, pos = self.slot_list[0], self.start[0]
            k_store[slot, :, pos : pos + steps] = key_states[0]
            v_store[slot, :, pos : pos + steps] = value_states[0]
            if pos == 0:
                return key_states, value_states
            return k_store[slot : slot + 1, :, : self.kv_len], v_store[slot : slot + 1, :, : self.kv_len]
        if steps > 1:
            if any(self.start):
                raise InferenceError("a batched prefill starts every row at position 0")
            k_store[self.slots, :, :steps] = key_states
            v_store[self.slots, :, :steps] = value_states
            return key_states, value_states
        k_store[self.slots, :, self.positions] = key_states[:, :, 0]
        v_store[self.slots, :, self.positions] = value_states[:, :, 0]
        if self.contiguous:
            return k_store[:batch, :, : self.kv_len], v_store[:batch, :, : self.kv_len]
        return k_store[self.slots, :, : self.kv_len], v_store[self.slots, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return min(self.start)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0
