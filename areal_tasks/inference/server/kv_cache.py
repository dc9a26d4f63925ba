"""Slot KV cache: every running sequence owns one slot holding its keys and values for every layer.

Storage per attention layer is one tensor of shape ``[2, slots, kv_heads, max_len, head_dim]``
(keys, then values; ``keys[layer]`` and ``values[layer]`` are its two halves, so a captured decode
step writes both with one kernel), allocated on the first write (the warm-up forward at start-up), so any model whose
attention goes through ``Cache.update`` works without reading head counts from its config.
Slots are handed out lowest first and the engine keeps running sequences in slots ``0..B-1``
(:meth:`SlotKVCache.move_many`), so a decode step reads one contiguous view instead of gathering.

**Retained slots** (the prefix cache, ``prefix_cache.py``): a slot released with ``retain=True``
is free (it counts in :attr:`SlotKVCache.free_slots`, so it never holds admission back) but keeps
its positions until the pool needs it. Taking the lowest free slot when it is retained moves its
content to the highest free slot that holds nothing, or, with none, over the least recently used
retained slot (that entry is dropped), or drops it when it is the least recently used itself. A
compaction move into a retained slot swaps the two: the retained content goes to the slot the
running sequence leaves. Every move and drop of content is told to the :class:`SlotEvents`
listener, which keeps its index of slots in step; nothing else changes a slot's content.

:class:`BatchCacheView` is the ``transformers`` ``Cache`` handed to one forward pass: its
``update`` writes the step's new keys/values into each row's slot at that row's positions and
returns the keys/values the rows attend to: for a prefill from position 0 the new ones
themselves, otherwise the rows' slots up to the longest filled length of the batch (the attention
mask built by the model runner hides each row's unfilled tail).
"""

from __future__ import annotations

import heapq
import logging
from typing import Protocol

import torch
from transformers.cache_utils import Cache

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.transfer import host_to_device

logger = logging.getLogger(__name__)


class SlotEvents(Protocol):
    """What a :class:`SlotKVCache` tells about retained content it moves or drops on its own."""

    def slots_moved(self, moves: dict[int, int]) -> None:
        """The content of each slot ``old`` now lives in slot ``moves[old]`` (applied all at once: a
        swap names both slots)."""

    def slots_dropped(self, slots: list[int]) -> None:
        """The retained content of ``slots`` is gone (the slots are plain free slots now)."""


class SlotKVCache:
    """Fixed-size pool of per-sequence KV slots (see the module doc)."""

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
        #: tokens whose keys/values are stored, per slot (retained slots keep theirs).
        self.lengths = [0] * num_slots
        self._free = list(range(num_slots))  # a min-heap: the lowest free slot first
        #: free slots that keep their content: slot -> last use (a counter; lowest: least recent).
        self._retained: dict[int, int] = {}
        self._clock = 0
        #: told when retained content moves or is dropped (the prefix cache's index).
        self.listener: SlotEvents | None = None

    # ---- slot pool ----
    @property
    def free_slots(self) -> int:
        """Free slots, retained ones included (any of them can be taken at once)."""
        return len(self._free)

    @property
    def retained_slots(self) -> list[int]:
        """The free slots that keep their content (ascending)."""
        return sorted(self._retained)

    def allocate(self) -> int:
        """Take the lowest free slot (its length starts at 0); raises when none is left. Retained
        content there moves away or is dropped first (see the module doc)."""
        if not self._free:
            raise InferenceError("KV cache has no free slot")
        slot = heapq.heappop(self._free)
        if slot in self._retained:
            self._vacate(slot)
        self.lengths[slot] = 0
        return slot

    def claim(self, slot: int, length: int) -> None:
        """Take the retained free ``slot`` itself, keeping its first ``length`` positions (the
        caller owns its content from now on: nothing is told to the listener)."""
        if slot not in self._retained:
            raise InferenceError(f"KV slot {slot} is not a retained free slot")
        if length > self.lengths[slot]:
            raise InferenceError(f"slot {slot} holds {self.lengths[slot]} positions, cannot keep {length}")
        del self._retained[slot]
        self._free.remove(slot)
        heapq.heapify(self._free)
        self.lengths[slot] = length

    def release(self, slot: int, retain: bool = False) -> None:
        """Give ``slot`` back to the pool; with ``retain`` it keeps its content until needed."""
        if slot in self._free:
            raise InferenceError(f"KV slot {slot} released twice")
        if retain and self.lengths[slot] > 0:
            self._retained[slot] = self._tick()
        else:
            self.lengths[slot] = 0
        heapq.heappush(self._free, slot)

    def touch(self, slot: int) -> None:
        """Mark a retained slot as just used (the last to be evicted)."""
        if slot in self._retained:
            self._retained[slot] = self._tick()

    def drop_retained(self, slots: list[int] | None = None) -> list[int]:
        """Forget the content of the retained ``slots`` (default: all of them); returns those dropped."""
        dropped = [s for s in (self._retained if slots is None else slots) if s in self._retained]
        for slot in dropped:
            del self._retained[slot]
            self.lengths[slot] = 0
        if dropped and self.listener is not None:
            self.listener.slots_dropped(dropped)
        return dropped

    @torch.inference_mode()  # the KV tensors are inference tensors: callers need not be in the mode
    def evacuate(self, slots: list[int], floor: int) -> None:
        """Move the retained content of ``slots`` to the highest free empty slots at or above
        ``floor`` (one indexed copy per layer), dropping what finds no room: those slots are about
        to be overwritten (a padded decode step's padding rows)."""
        leaving = [s for s in slots if s in self._retained]
        if not leaving:
            return
        room = sorted(
            (s for s in self._free if s >= floor and s not in self._retained and s not in slots), reverse=True
        )
        moves = list(zip(leaving, room))
        self.drop_retained(leaving[len(moves) :])
        if not moves:
            return
        length = max(self.lengths[s] for s, _ in moves)
        src = host_to_device([s for s, _ in moves], torch.long, self.device)
        dst = host_to_device([d for _, d in moves], torch.long, self.device)
        for store in self.kv.values():
            store[:, dst, :, :length] = store[:, src, :, :length]
        for source, target in moves:
            self.lengths[target], self._retained[target] = self.lengths[source], self._retained.pop(source)
            self.lengths[source] = 0
        if self.listener is not None:
            self.listener.slots_moved(dict(moves))

    def attach(self, listener: SlotEvents | None) -> None:
        """Make ``listener`` the one told of moves and drops (None: nobody), dropping the retained
        content first (an index it was not in: a new engine over this runner starts empty)."""
        self.drop_retained()
        self.listener = listener

    def free_slot_ids(self) -> list[int]:
        """The free slots (any order)."""
        return list(self._free)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    @torch.inference_mode()  # the KV tensors are inference tensors: callers need not be in the mode
    def _vacate(self, slot: int) -> None:
        """``slot`` was retained and is being taken: move its content to the highest plain free slot,
        else over the least recently used retained slot older than it, else drop it."""
        stamp = self._retained.pop(slot)
        plain = [s for s in self._free if s not in self._retained]
        if plain:
            target = max(plain)
        else:
            older = [s for s, used in self._retained.items() if used < stamp]
            if not older:
                self.lengths[slot] = 0
                if self.listener is not None:
                    self.listener.slots_dropped([slot])
                return
            target = min(older, key=self._retained.__getitem__)
            self.drop_retained([target])
        length = self.lengths[slot]
        for store in self.kv.values():
            store[:, target, :, :length] = store[:, slot, :, :length]
        self.lengths[target] = length
        self._retained[target] = stamp
        if self.listener is not None:
            self.listener.slots_moved({slot: target})

    @torch.inference_mode()  # the KV tensors are inference tensors: callers need not be in the mode
    def move_many(self, moves: list[tuple[int, int]]) -> None:
        """Move several slots at once (``(src, dst)`` pairs, every ``dst`` free and distinct, no slot
        both a source and a destination): one indexed copy per layer and tensor for all of them,
        instead of two slice copies per layer and move. A retained ``dst`` swaps: its content goes
        to ``src``, which stays retained (see the module doc)."""
        if not moves:
            return
        sources, targets = [s for s, _ in moves], [d for _, d in moves]
        free = set(self._free)
        if len(set(targets)) != len(moves) or not set(targets) <= free:
            raise InferenceError(f"invalid KV slot moves {moves}: the targets must be distinct free slots")
        if len(set(sources)) != len(moves) or set(sources) & free:
            raise InferenceError(f"invalid KV slot moves {moves}: the sources must be distinct slots in use")
        swaps = [(s, d) for s, d in moves if d in self._retained]
        saved: list[torch.Tensor] = []
        swap_len = max((self.lengths[d] for _, d in swaps), default=0)
        if swaps:  # the retained content, kept aside while the moves overwrite it
            parked = host_to_device([d for _, d in swaps], torch.long, self.device)
            saved = [store[:, parked, :, :swap_len].clone() for store in self.kv.values()]
        length = max(self.lengths[s] for s in sources)
        if length > 0:
            src = host_to_device(sources, torch.long, self.device)
            dst = host_to_device(targets, torch.long, self.device)
            for store in self.kv.values():
                store[:, dst, :, :length] = store[:, src, :, :length]
        if swaps:
            back = host_to_device([s for s, _ in swaps], torch.long, self.device)
            for store, content in zip(self.kv.values(), saved):
                store[:, back, :, :swap_len] = content
        swapped = {d: (self.lengths[d], self._retained.pop(d)) for _, d in swaps}
        self._free = [slot for slot in self._free if slot not in targets]
        for source, target in moves:
            self.lengths[target] = self.lengths[source]
            if target in swapped:
                self.lengths[source], self._retained[source] = swapped[target]
            else:
                self.lengths[source] = 0
            self._free.append(source)
        heapq.heapify(self._free)
        if self.listener is not None:
            self.listener.slots_moved({**dict(moves), **{d: s for s, d in swaps}})

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst`` (one copy per
        layer: keys and values together)."""
        if length > self.lengths[src]:
            raise InferenceError(f"slot {src} holds {self.lengths[src]} positions, cannot copy {length}")
        for store in self.kv.values():
            store[:, dst, :, :length] = store[:, src, :, :length]
        self.lengths[dst] = length

    def copy_prefixes(self, copies: list[tuple[int, int, int]]) -> None:
        """:meth:`copy_prefix` for several ``(src, dst, length)`` at once: one indexed copy per layer
        for each distinct length (the siblings of one prompt share theirs), instead of one per layer
        and copy. Every ``dst`` must be distinct and no source."""
        if not copies:
            return
        targets = [dst for _, dst, _ in copies]
        if len(set(targets)) != len(targets) or set(targets) & {src for src, _, _ in copies}:
            raise InferenceError(f"invalid KV prefix copies {copies}: the targets must be distinct and not sources")
        by_length: dict[int, list[tuple[int, int]]] = {}
        for src, dst, length in copies:
            if length > self.lengths[src]:
                raise InferenceError(f"slot {src} holds {self.lengths[src]} positions, cannot copy {length}")
            by_length.setdefault(length, []).append((src, dst))
        for length, pairs in by_length.items():
            src = host_to_device([s for s, _ in pairs], torch.long, self.device)
            dst = host_to_device([d for _, d in pairs], torch.long, self.device)
            for store in self.kv.values():
                store[:, dst, :, :length] = store[:, src, :, :length]
            for _, slot in pairs:
                self.lengths[slot] = length

    def clear(self) -> None:
        """Drop the retained content and zero the storage in place (``/flush_cache`` on an idle
        server; addresses stay valid for captured CUDA graphs)."""
        if len(self._free) != self.num_slots:
            raise InferenceError("cannot clear the KV cache while slots are in use")
        self.drop_retained()
        for tensor in self.kv.values():
            tensor.zero_()

    # ---- usage figures ----
    @property
    def used_tokens(self) -> int:
        """Positions filled in slots in use (retained slots are reclaimable: not counted)."""
        return sum(self.lengths) - self.retained_tokens

    @property
    def retained_tokens(self) -> int:
        """Positions kept in retained free slots."""
        return sum(self.lengths[s] for s in list(self._retained))  # a snapshot: /metrics reads it

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
    from position 0 (several rows, right-padded), from ``start`` (one row), or from each row's own
    ``start`` (several rows, right-padded: a prefill after cached prefixes; row ``b``'s padding
    writes past its own tokens, which nothing reads, so ``start[b] + T`` must fit the slot).
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
                return self._update_ragged(k_store, v_store, key_states, value_states)
            k_store[self.slots, :, :steps] = key_states
            v_store[self.slots, :, :steps] = value_states
            return key_states, value_states
        k_store[self.slots, :, self.positions] = key_states[:, :, 0]
        v_store[self.slots, :, self.positions] = value_states[:, :, 0]
        if self.contiguous:
            return k_store[:batch, :, : self.kv_len], v_store[:batch, :, : self.kv_len]
        return k_store[self.slots, :, : self.kv_len], v_store[self.slots, :, : self.kv_len]

    def _update_ragged(
        self, k_store: torch.Tensor, v_store: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of T tokens written from their own starts; returns every row's keys/values up to ``kv_len``."""
        steps = key_states.shape[2]
        if max(self.start) + steps > self.store.max_len:
            raise InferenceError(f"a prefill of {steps} tokens from {max(self.start)} does not fit the slot")
        positions = self.positions.view(-1, 1) + torch.arange(steps, device=self.positions.device)
        rows = self.slots.view(-1, 1)
        k_store[rows, :, positions] = key_states.transpose(1, 2)
        v_store[rows, :, positions] = value_states.transpose(1, 2)
        return k_store[self.slots, :, : self.kv_len], v_store[self.slots, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return min(self.start)

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0
