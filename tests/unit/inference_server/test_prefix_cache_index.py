"""The prefix cache's bookkeeping without a model: retained slots in ``SlotKVCache`` (kept while free,
moved out of the way or evicted least recently used first, swapped by a compaction move, dropped by
a flush) and the token index of ``PrefixCache`` (longest prefix at block boundaries and inside a
block, exact prompts with their logits, entries that grow on release, moves and drops followed)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.kv_cache import SlotKVCache
from areal_tasks.inference.server.prefix_cache import PrefixCache, PrefixMatch, chain_keys

SLOTS, MAX_LEN = 5, 40


class Recorder:
    """A ``SlotEvents`` listener that writes down what it is told."""

    def __init__(self) -> None:
        self.moved: list[dict[int, int]] = []
        self.dropped: list[list[int]] = []

    def slots_moved(self, moves: dict[int, int]) -> None:
        self.moved.append(dict(moves))

    def slots_dropped(self, slots: list[int]) -> None:
        self.dropped.append(list(slots))


def _cache() -> SlotKVCache:
    """Storage of two layers whose every position says which slot wrote it (slot * 100 + position)."""
    cache = SlotKVCache(num_slots=SLOTS, max_len=MAX_LEN, device=torch.device("cpu"))
    marks = torch.arange(SLOTS).view(SLOTS, 1, 1, 1) * 100.0 + torch.arange(MAX_LEN).view(1, 1, MAX_LEN, 1)
    for layer in range(2):
        keys = marks.expand(SLOTS, 2, MAX_LEN, 3).clone()
        cache.kv[layer] = torch.stack((keys, -keys))
        cache.keys[layer], cache.values[layer] = cache.kv[layer].unbind(0)
    return cache


def _fill(cache: SlotKVCache, slot: int, length: int) -> None:
    cache.lengths[slot] = length


def _origin(cache: SlotKVCache, slot: int, length: int) -> set[int]:
    """Which slots' marks fill the first ``length`` positions of ``slot`` (both layers, K and V)."""
    found = set()
    for store in cache.kv.values():
        marks = store[0, slot, 0, :length, 0]
        assert torch.equal(store[1, slot, 0, :length, 0], -marks)
        assert torch.equal(marks % 100, torch.arange(length, dtype=marks.dtype))
        found |= {int(m) // 100 for m in marks}
    return found


def test_retained_slots_stay_free_and_move_out_of_the_way_of_allocation() -> None:
    cache, events = _cache(), Recorder()
    cache.listener = events
    taken = [cache.allocate() for _ in range(3)]
    assert taken == [0, 1, 2]
    _fill(cache, 0, 7)
    cache.release(0, retain=True)
    assert cache.free_slots == 3 and cache.retained_slots == [0]
    assert cache.retained_tokens == 7 and cache.used_tokens == 0
    # the lowest free slot is the retained one: its content moves to the highest plain free slot
    assert cache.allocate() == 0 and cache.lengths[0] == 0
    assert events.moved == [{0: 4}] and cache.retained_slots == [4] and cache.lengths[4] == 7
    assert _origin(cache, 4, 7) == {0}


def test_with_only_retained_slots_free_the_least_recently_used_is_evicted() -> None:
    cache, events = _cache(), Recorder()
    cache.listener = events
    for slot in range(SLOTS):
        cache.allocate()
        _fill(cache, slot, slot + 2)
    for slot in (3, 1, 4):  # released in this order: 3 is the least recently used
        cache.release(slot, retain=True)
    cache.touch(3)  # now 1 is
    assert cache.allocate() == 1
    # slot 1 was the least recently used itself: its content is dropped, nothing moves
    assert events.dropped == [[1]] and events.moved == [] and cache.retained_slots == [3, 4]
    cache.release(0, retain=True)  # 0 is now the most recent; 4 the least
    assert cache.allocate() == 0
    assert events.dropped[-1] == [4] and events.moved == [{0: 4}]
    assert cache.retained_slots == [3, 4] and cache.lengths[4] == 2 and _origin(cache, 4, 2) == {0}


def test_a_compaction_move_into_a_retained_slot_swaps_the_two() -> None:
    cache, events = _cache(), Recorder()
    cache.listener = events
    for _ in range(4):
        cache.allocate()
    _fill(cache, 1, 9)
    _fill(cache, 3, 5)
    cache.release(1, retain=True)
    cache.move_many([(3, 1)])  # the running sequence in slot 3 fills the hole at 1
    assert cache.lengths[1] == 5 and _origin(cache, 1, 5) == {3}
    assert cache.retained_slots == [3] and cache.lengths[3] == 9 and _origin(cache, 3, 9) == {1}
    assert events.moved == [{3: 1, 1: 3}]
    assert sorted(cache.free_slot_ids()) == [3, 4] and cache.used_tokens == 5


def test_evacuate_moves_retained_content_above_a_floor_or_drops_it() -> None:
    cache, events = _cache(), Recorder()
    cache.listener = events
    for slot in range(SLOTS):
        cache.allocate()
        _fill(cache, slot, slot + 3)
    for slot in (1, 2, 3):
        cache.release(slot, retain=True)
    cache.release(4)  # free and empty: the only room at or above the floor
    cache.evacuate([1, 2, 0], floor=3)  # 0 is in use: not retained, left alone
    assert events.dropped == [[2]] and events.moved == [{1: 4}]
    assert cache.retained_slots == [3, 4] and cache.lengths[4] == 4 and _origin(cache, 4, 4) == {1}
    assert cache.lengths[1] == cache.lengths[2] == 0 and cache.lengths[0] == 3


def test_claim_release_and_clear() -> None:
    cache = _cache()
    slot = cache.allocate()
    _fill(cache, slot, 6)
    cache.release(slot, retain=True)
    cache.claim(slot, 4)
    assert cache.lengths[slot] == 4 and slot not in cache.free_slot_ids() and cache.retained_slots == []
    with pytest.raises(InferenceError, match="not a retained"):
        cache.claim(1, 0)
    cache.release(slot, retain=True)
    with pytest.raises(InferenceError, match="cannot keep"):
        cache.claim(slot, 5)
    empty = cache.allocate()  # the lowest slot: the retained content moves to the highest free one
    assert empty == slot and cache.retained_slots == [SLOTS - 1] and cache.lengths[SLOTS - 1] == 4
    cache.release(empty, retain=True)  # nothing in it: not retained
    assert cache.retained_slots == [SLOTS - 1]
    cache.clear()
    assert cache.retained_slots == [] and cache.lengths == [0] * SLOTS


BLOCK = 4


def _prefix() -> tuple[SlotKVCache, PrefixCache]:
    cache = _cache()
    return cache, PrefixCache(cache, block_size=BLOCK)


def _live(cache: SlotKVCache, prefix: PrefixCache, tokens: list[int], logits: torch.Tensor | None = None) -> int:
    slot = cache.allocate()
    _fill(cache, slot, len(tokens))
    prefix.register(slot, tokens, logits)
    return slot


def test_chain_keys_depend_on_every_earlier_block() -> None:
    a = chain_keys(list(range(12)), BLOCK)
    b = chain_keys([99, *range(1, 12)], BLOCK)
    assert len(a) == 3 and all(x != y for x, y in zip(a, b))
    assert chain_keys(list(range(12)), BLOCK, start=1, previous=a[0]) == a[1:]


@pytest.mark.parametrize(
    "query,limit,expected",
    [
        ([*range(3), 50], 10, None),  # less than one whole block in common
        ([*range(4), 50, 51], 10, 4),  # exactly one block
        ([*range(5), 50], 10, 5),  # one block and one token into the next
        ([*range(7), 50], 10, 7),  # a block boundary minus one
        ([*range(8), 50], 10, 8),  # exactly two blocks
        ([*range(10), 50], 10, 10),  # the entry's end, inside a block
        (list(range(10)), 9, 9),  # the whole entry asked for, capped at the limit
        (list(range(10)), 3, None),  # a limit below one block
    ],
)
def test_lookup_finds_the_longest_prefix_to_the_token(query: list[int], limit: int, expected: int | None) -> None:
    cache, prefix = _prefix()
    slot = _live(cache, prefix, list(range(10)))
    _live(cache, prefix, [*range(4), 70, 71, 72, 73])  # shares one block with everything above
    match = prefix.lookup(query, limit)
    if expected is None:
        assert match is None
    else:
        assert match is not None and match.length == expected
        assert match.entry.slot == slot or expected == 4


def test_exact_prompts_carry_their_logits_and_release_extends_the_entry() -> None:
    cache, prefix = _prefix()
    logits = torch.randn(11)
    prompt = [5, 6, 7, 8, 9, 10]
    slot = _live(cache, prefix, prompt, logits)
    entry = prefix.exact(prompt)
    assert entry is not None and entry.logits is logits and prefix.exact(prompt[:-1]) is None
    # the sequence ran on: its prompt and 5 output tokens are kept, the last one without KV
    output = [20, 21, 22, 23, 24]
    _fill(cache, slot, len(prompt) + 4)
    prefix.release(slot, prompt + output)
    assert cache.retained_slots == [slot] and not entry.live
    assert entry.tokens == prompt + output[:4] and entry.keys == chain_keys(entry.tokens, BLOCK)
    assert prefix.exact(prompt) is entry  # the prompt's logits still hold
    match = prefix.lookup(prompt + output + [1], 99)
    assert match == PrefixMatch(entry, 10)
    # matched to its end, a retained entry is claimed in place, without a copy
    assert prefix.acquire(match) == (slot, 10) and prefix.entries == 0 and cache.retained_slots == []


def test_a_partial_match_copies_and_leaves_the_entry() -> None:
    cache, prefix = _prefix()
    tokens = list(range(12))
    _live(cache, prefix, [7] * 3)  # slot 0 stays in use
    slot = _live(cache, prefix, tokens)
    prefix.release(slot, tokens)
    entry = prefix.entry(slot)
    # the lowest free slot is the entry's own: the entry moves up first, then is copied from
    got, length = prefix.acquire(PrefixMatch(entry, 9))
    assert (got, length) == (slot, 9) and entry.slot == SLOTS - 1 and prefix.entry(SLOTS - 1) is entry
    assert cache.lengths[got] == 9 and _origin(cache, got, 9) == {slot}
    assert cache.lengths[entry.slot] == 12 and _origin(cache, entry.slot, 12) == {slot}
    again, length = prefix.acquire(PrefixMatch(entry, 5))  # a plain free slot: one copy
    assert (again, length) == (2, 5) and entry.slot == SLOTS - 1 and _origin(cache, again, 5) == {slot}


def test_entries_follow_moves_and_drops_and_invalidate_forgets_all() -> None:
    cache, prefix = _prefix()
    a = _live(cache, prefix, list(range(8)))
    b = _live(cache, prefix, list(range(100, 108)))
    prefix.release(a, list(range(8)))
    cache.move_many([(b, a)])  # compaction: b fills a's hole, a's entry swaps to b's slot
    assert prefix.entry(a).tokens == list(range(100, 108)) and prefix.entry(b).tokens == list(range(8))
    assert prefix.lookup([*range(8), 1], 99).entry.slot == b
    cache.drop_retained([b])
    assert prefix.entry(b) is None and prefix.lookup([*range(8), 1], 99) is None
    assert prefix.invalidate() == 1 and prefix.entries == 0
    prefix.release(a, list(range(100, 108)))  # an entry dropped while live is not kept
    assert cache.retained_slots == [] and cache.free_slots == SLOTS
