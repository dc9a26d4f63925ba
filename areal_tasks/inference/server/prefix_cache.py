"""The prefix cache: KV of earlier sequences, found again by their token ids and reused.

Every slot that holds the KV of a text sequence has a :class:`CacheEntry`: the token ids whose
keys and values fill the slot's first positions, and the logits that followed the prompt. An entry
is *live* while its sequence runs (indexed by its prompt) and *retained* once the sequence has
finished (indexed by prompt and output, up to the positions the slot holds): its slot is free
(``kv_cache.py``: it never holds admission back) and keeps its content until the pool needs the
slot, the least recently used first.

**Lookup.** Entries are indexed by a chained hash of their full blocks of ``block_size`` tokens
(block ``k``'s key hashes block ``k - 1``'s key and the block's tokens), so walking a query's
blocks finds the entries sharing its longest run of whole blocks; the match is then checked token
by token (hash collisions cannot pass) and extended past the last whole block, so it ends at the
exact first differing token. A second index keys each entry by its whole prompt: a query equal to
an entry's prompt takes that prompt's logits too, and needs no forward at all.

**Reuse.** :meth:`PrefixCache.acquire` gives the new sequence a slot holding the matched positions:
a retained entry matched to its end is claimed in place (no copy); otherwise the lowest free slot
is taken and the matched positions are copied into it, leaving the entry for others. The caller
prefills only the tokens after the match, from that position (at least the last token, for its
logits, unless the prompt's logits came with an exact match).

**What is never shared.** Prompts with images (``SequenceGroup.vision``) are neither looked up nor
kept: their KV holds the vision tower's features at placeholder tokens whose ids say nothing of the
image, and their prefill runs from position 0 with multimodal rotary positions. KV computed under
other weights is never reused: :meth:`PrefixCache.invalidate` (the engine's ``weights_changed``,
called by every weight update) drops every entry, live ones included, so the sequences running
across an update free their slots without keeping them. A ``/flush_cache`` drops them too
(``SlotKVCache.clear``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.kv_cache import SlotKVCache

logger = logging.getLogger(__name__)

#: tokens per indexed block (a query shares at least one whole block with an entry to match it,
#: or equals an entry's prompt).
DEFAULT_BLOCK_SIZE = 16


@dataclass(eq=False)
class CacheEntry:
    """The KV one slot holds for a text sequence (see the module doc)."""

    slot: int
    #: the token ids whose keys/values fill the slot's positions ``0..len(tokens)-1``.
    tokens: list[int]
    #: the chained key of each whole block of ``tokens``.
    keys: list[int] = field(default_factory=list)
    #: the logits [V] after ``tokens[:logits_len]`` (the prompt), under the current weights.
    logits: torch.Tensor | None = None
    logits_len: int = 0
    #: the key of ``tokens[:logits_len]`` in the exact-prompt index (None without logits).
    prompt_key: int | None = None
    #: whether its sequence still runs (else its slot is a retained free slot).
    live: bool = True


@dataclass(frozen=True)
class PrefixMatch:
    """The longest cached prefix of a query: ``length`` tokens of ``entry``."""

    entry: CacheEntry
    length: int


def chain_keys(tokens: list[int], block_size: int, start: int = 0, previous: int = 0) -> list[int]:
    """The chained keys of the whole blocks of ``tokens`` from block ``start`` on, continuing from
    the key ``previous`` of block ``start - 1`` (0 before the first block)."""
    keys = []
    for begin in range(start * block_size, len(tokens) - block_size + 1, block_size):
        previous = hash((previous, tuple(tokens[begin : begin + block_size])))
        keys.append(previous)
    return keys


class PrefixCache:
    """The entries of one :class:`SlotKVCache`, indexed by their token ids (see the module doc)."""

    def __init__(self, cache: SlotKVCache, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1:
            raise InferenceError(f"prefix cache block_size must be >= 1, got {block_size}")
        self.cache = cache
        self.block_size = block_size
        self._by_slot: dict[int, CacheEntry] = {}
        self._blocks: dict[int, set[CacheEntry]] = {}
        self._prompts: dict[int, set[CacheEntry]] = {}
        cache.attach(self)  # an earlier engine's retained entries are dropped

    # ---- figures ----
    @property
    def entries(self) -> int:
        """Entries live and retained."""
        return len(self._by_slot)

    def entry(self, slot: int) -> CacheEntry | None:
        """The entry of ``slot``, if any."""
        return self._by_slot.get(slot)

    # ---- lookup ----
    def exact(self, tokens: list[int]) -> CacheEntry | None:
        """An entry whose prompt is ``tokens``, with the logits that follow it."""
        found = self._prompts.get(hash(tuple(tokens)))
        if not found:
            return None
        for entry in sorted(found, key=_claimable_first):
            if entry.logits_len == len(tokens) and entry.tokens[: len(tokens)] == tokens:
                return entry
        return None

    def lookup(self, tokens: list[int], limit: int) -> PrefixMatch | None:
        """The entry sharing the longest prefix with ``tokens``, at most ``limit`` tokens of it
        (None: no whole block in common)."""
        candidates: set[CacheEntry] | None = None
        blocks = 0
        previous = 0
        size = self.block_size
        for begin in range(0, min(len(tokens), limit) - size + 1, size):
            previous = hash((previous, tuple(tokens[begin : begin + size])))
            found = self._blocks.get(previous)
            if not found:
                break
            candidates, blocks = found, blocks + 1
        if not candidates:
            return None
        best: PrefixMatch | None = None
        checked = blocks * size
        for entry in sorted(candidates, key=_claimable_first):
            if entry.tokens[:checked] != tokens[:checked]:
                continue  # a hash collision
            length, end = checked, min(len(entry.tokens), len(tokens), limit)
            while length < end and entry.tokens[length] == tokens[length]:
                length += 1
            if best is None or length > best.length:
                best = PrefixMatch(entry, length)
        return best

    def acquire(self, match: PrefixMatch) -> tuple[int, int]:
        """A slot for a new sequence holding ``match``'s positions: ``(slot, positions)``. A
        retained entry matched to its end (or when no free slot is empty, so that taking one would
        evict an entry anyway) is claimed;
        otherwise the lowest free slot is taken and the positions copied into it (0 positions if
        taking it evicted the entry)."""
        entry = match.entry
        no_empty_slot = self.cache.free_slots == len(self.cache.retained_slots)  # taking one evicts an entry
        if not entry.live and (match.length == len(entry.tokens) or no_empty_slot):
            self._forget(entry)
            self.cache.claim(entry.slot, match.length)
            return entry.slot, match.length
        self.cache.touch(entry.slot)  # the most recently used: taking a slot does not evict it first
        slot = self.cache.allocate()
        if self._by_slot.get(entry.slot) is not entry:
            return slot, 0
        self.cache.copy_prefix(entry.slot, slot, match.length)
        return slot, match.length

    # ---- entries ----
    def register(self, slot: int, tokens: list[int], logits: torch.Tensor | None) -> None:
        """``slot`` (in use) now holds the KV of ``tokens``, the prompt of a running sequence (or its
        prompt and output so far); ``logits`` [V] follow them."""
        self._forget_slot(slot)
        entry = CacheEntry(slot, list(tokens), chain_keys(tokens, self.block_size))
        if logits is not None:
            entry.logits, entry.logits_len = logits, len(tokens)
            entry.prompt_key = hash(tuple(tokens))
        self._add(entry)

    def release(self, slot: int, tokens: list[int] | None) -> None:
        """Free the in-use ``slot``: with ``tokens`` (what its first positions hold) its entry is
        kept, retained; without (a sequence whose KV must not be reused), it is forgotten."""
        entry = self._by_slot.get(slot)
        tokens = None if tokens is None else tokens[: self.cache.lengths[slot]]
        if entry is None or not tokens:
            self._forget_slot(slot)
            self.cache.release(slot)
            return
        self._unindex(entry)
        if tokens[: len(entry.tokens)] == entry.tokens:  # it grew: hash the new blocks only
            whole = len(entry.keys)
            entry.keys += chain_keys(tokens, self.block_size, whole, entry.keys[-1] if whole else 0)
        else:
            entry.keys = chain_keys(tokens, self.block_size)
        if entry.logits_len > len(tokens) or tokens[: entry.logits_len] != entry.tokens[: entry.logits_len]:
            entry.logits, entry.logits_len, entry.prompt_key = None, 0, None
        entry.tokens, entry.live = tokens, False
        self._index(entry)
        self.cache.release(slot, retain=True)

    def invalidate(self) -> int:
        """Forget every entry, live and retained (the weights changed); returns how many."""
        count = len(self._by_slot)
        self._by_slot.clear()
        self._blocks.clear()
        self._prompts.clear()
        self.cache.drop_retained()
        return count

    # ---- SlotEvents (the KV cache moved or dropped retained content) ----
    def slots_moved(self, moves: dict[int, int]) -> None:
        moved = [(self._by_slot.pop(old), new) for old, new in moves.items() if old in self._by_slot]
        for entry, new in moved:
            entry.slot = new
            self._by_slot[new] = entry

    def slots_dropped(self, slots: list[int]) -> None:
        for slot in slots:
            self._forget_slot(slot)

    # ---- index ----
    def _add(self, entry: CacheEntry) -> None:
        self._by_slot[entry.slot] = entry
        self._index(entry)

    def _index(self, entry: CacheEntry) -> None:
        for key in entry.keys:
            self._blocks.setdefault(key, set()).add(entry)
        if entry.prompt_key is not None:
            self._prompts.setdefault(entry.prompt_key, set()).add(entry)

    def _unindex(self, entry: CacheEntry) -> None:
        for key in entry.keys:
            _discard(self._blocks, key, entry)
        if entry.prompt_key is not None:
            _discard(self._prompts, entry.prompt_key, entry)

    def _forget(self, entry: CacheEntry) -> None:
        self._unindex(entry)
        if self._by_slot.get(entry.slot) is entry:
            del self._by_slot[entry.slot]

    def _forget_slot(self, slot: int) -> None:
        entry = self._by_slot.get(slot)
        if entry is not None:
            self._forget(entry)


def _claimable_first(entry: CacheEntry) -> tuple[bool, int]:
    """Candidates in a fixed order: retained entries (claimable without a copy) first, then by slot."""
    return entry.live, entry.slot


def _discard(index: dict[int, set[CacheEntry]], key: int, entry: CacheEntry) -> None:
    found = index.get(key)
    if found is not None:
        found.discard(entry)
        if not found:
            del index[key]
