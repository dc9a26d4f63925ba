"""Slot KV cache: every running sequence owns one slot holding its keys and values for every layer.

Storage per attention layer is one K and one V tensor of shape ``[slots, kv_heads, max_len,
head_dim]``, allocated on the first write (the warm-up forward at start-up), so any model whose
attention goes through ``Cache.update`` works without reading head counts from its config.

:class:`BatchCacheView` is the ``transformers`` ``Cache`` handed to one forward pass: its
``update`` writes the step's new keys/values into each row's slot at that row's positions and
returns the keys/values of the rows' slots up to the longest filled length of the batch (the
attention mask built by the model runner hides each row's unfilled tail).
"""

from __future__ import annotations

import logging

import torch
from transformers.cache_utils import Cache

from areal_tasks.errors import InferenceError

logger = logging.getLogger(__name__)


class SlotKVCache:
    """Fixed-size pool of per-sequence KV slots."""

    def __init__(self, num_slots: int, max_len: int, device: torch.device) -> None:
        if num_slots < 1 or max_len < 2:
            raise InferenceError(f"KV cache needs num_slots >= 1 and max_len >= 2, got {num_slots}, {max_len}")
        self.num_slots = num_slots
        self.max_len = max_len
        self.device = device
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        #: tokens whose keys/values are stored, per slot.
        self.lengths = [0] * num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    # ---- slot pool ----
    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """Take a free slot (its length starts at 0); raises when none is left."""
        if not self._free:
            raise InferenceError("KV cache has no free slot")
        slot = self._free.pop()
        self.lengths[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Give ``slot`` back to the pool."""
        if slot in self._free:
            raise InferenceError(f"KV slot {slot} released twice")
        self.lengths[slot] = 0
        self._free.append(slot)

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst``."""
        if length > self.lengths[src]:
            raise InferenceError(f"slot {src} holds {self.lengths[src]} positions, cannot copy {length}")
        for layer in self.keys:
            self.keys[layer][dst, :, :length] = self.keys[layer][src, :, :length]
            self.values[layer][dst, :, :length] = self.values[layer][src, :, :length]
        self.lengths[dst] = length

    def clear(self) -> None:
        """Drop the storage (``/flush_cache`` on an idle server); it is allocated again on next use."""
        if len(self._free) != self.num_slots:
            raise InferenceError("cannot clear the KV cache while slots are in use")
        self.keys.clear()
        self.values.clear()

    # ---- usage figures ----
    @property
    def used_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def capacity_tokens(self) -> int:
        return self.num_slots * self.max_len

    @property
    def bytes_allocated(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values()))

    # ---- storage ----
    def _ensure_layer(self, layer: int, like: torch.Tensor) -> None:
        if layer in self.keys:
            return
        _, kv_heads, _, head_dim = like.shape
        shape = (self.num_slots, kv_heads, self.max_len, head_dim)
        self.keys[layer] = torch.zeros(shape, dtype=like.dtype, device=self.device)
        self.values[layer] = torch.zeros(shape, dtype=like.dtype, device=self.device)
        if layer == 0:
            logger.info("KV cache: %d slots x %d positions, %d kv heads x %d dims, %s",
                        self.num_slots, self.max_len, kv_heads, head_dim, like.dtype)

    def write_read(
        self,
        layer: int,
        slots: torch.Tensor,
        start: list[int],
        keys: torch.Tensor,
        values: torch.Tensor,
        kv_len: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``keys``/``values`` [B, kv_heads, T, head_dim] at positions ``start[b]..start[b]+T`` of
        each row's slot; return the rows' keys/values over positions ``0..kv_len``."""
        self._ensure_layer(layer, keys)
        k_store, v_store = self.keys[layer], self.values[layer]
        batch, _, steps, _ = keys.shape
        if batch == 1:
            slot, pos = int(slots[0]), start[0]
            k_store[slot, :, pos : pos + steps] = keys[0]
            v_store[slot, :, pos : pos + steps] = values[0]
            return k_store[slot : slot + 1, :, :kv_len], v_store[slot : slot + 1, :, :kv_len]
        if steps != 1:
            raise InferenceError("a batched forward writes one position per row")
        pos = torch.tensor(start, device=keys.device)
        k_store[slots, :, pos] = keys[:, :, 0]
        v_store[slots, :, pos] = values[:, :, 0]
        return k_store[slots, :, :kv_len], v_store[slots, :, :kv_len]


class BatchCacheView(Cache):
    """The ``Cache`` of one forward pass over some slots (see the module doc)."""

    def __init__(self, store: SlotKVCache, slots: list[int], start: list[int], kv_len: int) -> None:
        super().__init__(layers=[])
        self.store = store
        self.slots = torch.tensor(slots, device=store.device)
        self.start = start
        self.kv_len = kv_len

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.store.write_read(layer_idx, self.slots, self.start, key_states, value_states, self.kv_len)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return min(self.start)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0
