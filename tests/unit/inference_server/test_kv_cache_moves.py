"""``SlotKVCache.move_many``: several slots move in one copy per layer, carrying their cached
positions and lengths, freeing the sources; invalid move sets are refused and change nothing."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.kv_cache import SlotKVCache


def _filled_cache() -> SlotKVCache:
    cache = SlotKVCache(num_slots=6, max_len=8, device=torch.device("cpu"))
    for _ in range(6):
        cache.allocate()
    for layer in range(2):
        keys = torch.arange(6 * 2 * 8 * 3, dtype=torch.float32).view(6, 2, 8, 3) + 1000 * layer
        cache.kv[layer] = torch.stack((keys, -keys))  # the layout _ensure_layer allocates
        cache.keys[layer], cache.values[layer] = cache.kv[layer].unbind(0)
    cache.lengths[:] = [3, 1, 4, 5, 2, 6]
    for slot in (0, 1):
        cache.release(slot)
    return cache


def test_moves_carry_positions_and_lengths():
    cache = _filled_cache()
    before = {layer: (cache.keys[layer].clone(), cache.values[layer].clone()) for layer in cache.keys}
    cache.move_many([(5, 0), (3, 1)])
    assert sorted(cache.free_slot_ids()) == [3, 5]
    assert cache.lengths[:3] == [6, 5, 4] and cache.lengths[3] == 0 and cache.lengths[5] == 0
    for layer, (keys, values) in before.items():
        assert torch.equal(cache.keys[layer][0, :, :6], keys[5, :, :6])
        assert torch.equal(cache.keys[layer][1, :, :5], keys[3, :, :5])
        assert torch.equal(cache.values[layer][1, :, :5], values[3, :, :5])
        assert torch.equal(cache.keys[layer][2], keys[2])  # untouched
    assert cache.allocate() == 3


@pytest.mark.parametrize(
    "moves,what",
    [
        ([(5, 2)], "targets"),  # target in use
        ([(5, 0), (4, 0)], "targets"),  # the same target twice
        ([(1, 0)], "sources"),  # source is free
        ([(5, 0), (5, 1)], "sources"),  # the same source twice
    ],
)
def test_invalid_moves_are_refused_and_change_nothing(moves, what):
    cache = _filled_cache()
    free, lengths = sorted(cache.free_slot_ids()), list(cache.lengths)
    with pytest.raises(InferenceError, match=what):
        cache.move_many(moves)
    assert sorted(cache.free_slot_ids()) == free and cache.lengths == lengths


def test_prefix_copies_share_one_copy_per_length():
    """``copy_prefixes``: each target gets its source's first ``length`` positions and that length;
    invalid sets (a repeated target, a target that is a source, a length past the source) are refused."""
    cache = _filled_cache()
    cache.release(2)
    first, second, third = cache.allocate(), cache.allocate(), cache.allocate()  # the freed 0, 1 and 2
    before = {layer: cache.keys[layer].clone() for layer in cache.keys}
    cache.copy_prefixes([(5, first, 4), (5, second, 4), (3, third, 2)])
    assert (cache.lengths[first], cache.lengths[second], cache.lengths[third]) == (4, 4, 2)
    for layer, keys in before.items():
        assert torch.equal(cache.keys[layer][first, :, :4], keys[5, :, :4])
        assert torch.equal(cache.keys[layer][second, :, :4], keys[5, :, :4])
        assert torch.equal(cache.keys[layer][third, :, :2], keys[3, :, :2])
    with pytest.raises(InferenceError, match="distinct"):
        cache.copy_prefixes([(5, first, 1), (4, first, 1)])
    with pytest.raises(InferenceError, match="distinct"):
        cache.copy_prefixes([(5, first, 1), (first, second, 1)])
    with pytest.raises(InferenceError, match="cannot copy"):
        cache.copy_prefixes([(third, first, 3)])
