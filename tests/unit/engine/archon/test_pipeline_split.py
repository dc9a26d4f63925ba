"""``split_layers``: contiguous stages of at least one layer whose largest cost is the smallest possible
(checked against brute force), with the embedding/head extras on the first/last stage."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest

from areal_tasks.engine.archon.pipeline.split import balanced_split, split_layers, stage_costs
from areal_tasks.errors import EngineError


def _stage_costs(ranges, costs, first, last):
    out = [sum(costs[i] for i in r) for r in ranges]
    out[0] += first
    out[-1] += last
    return out


def _brute_force_bottleneck(costs, n_stages, first, last):
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), n_stages - 1):
        bounds = [0, *cuts, n]
        ranges = [range(a, b) for a, b in itertools.pairwise(bounds)]
        best = min(best, max(_stage_costs(ranges, costs, first, last)))
    return best


def _check_partition(ranges, n_layers, n_stages):
    assert len(ranges) == n_stages
    assert ranges[0].start == 0 and ranges[-1].stop == n_layers
    for a, b in itertools.pairwise(ranges):
        assert a.stop == b.start
    assert all(len(r) >= 1 for r in ranges)


def test_equal_layers_split_evenly():
    assert split_layers([1.0] * 8, 4) == [range(2), range(2, 4), range(4, 6), range(6, 8)]
    sizes = sorted(len(r) for r in split_layers([1.0] * 8, 3))
    assert sizes == [2, 3, 3]


def test_extras_move_layers_off_the_first_and_last_stage():
    ranges = split_layers([1.0] * 8, 4, first_extra=1.0, last_extra=1.0)
    _check_partition(ranges, 8, 4)
    assert len(ranges[0]) <= 2 and len(ranges[-1]) <= 2
    assert max(_stage_costs(ranges, [1.0] * 8, 1.0, 1.0)) == 3.0


def test_one_stage_takes_everything():
    assert split_layers([3.0, 1.0], 1, first_extra=5.0, last_extra=7.0) == [range(2)]


def test_one_layer_per_stage():
    assert split_layers([5.0, 1.0, 9.0], 3) == [range(1), range(1, 2), range(2, 3)]


@pytest.mark.parametrize("seed", range(20))
def test_bottleneck_is_optimal_against_brute_force(seed):
    rng = random.Random(seed)
    n_layers = rng.randint(2, 9)
    n_stages = rng.randint(1, n_layers)
    costs = [rng.choice([1.0, 2.0, 4.0, rng.uniform(0.1, 5.0)]) for _ in range(n_layers)]
    first, last = rng.uniform(0, 4), rng.uniform(0, 6)
    ranges = split_layers(costs, n_stages, first_extra=first, last_extra=last)
    _check_partition(ranges, n_layers, n_stages)
    got = max(_stage_costs(ranges, costs, first, last))
    assert got == pytest.approx(_brute_force_bottleneck(costs, n_stages, first, last), rel=1e-9)


def test_fewer_layers_than_stages_names_the_field():
    with pytest.raises(EngineError, match=r"n_stages=4"):
        split_layers([1.0, 1.0, 1.0], 4)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_stage_count(bad):
    with pytest.raises(EngineError, match="n_stages"):
        split_layers([1.0, 1.0], bad)


def test_negative_or_nan_costs_are_refused():
    with pytest.raises(EngineError, match="finite"):
        split_layers([1.0, -1.0], 2)
    with pytest.raises(EngineError, match="finite"):
        split_layers([1.0, float("nan")], 2)


class _FakeArgs(SimpleNamespace):
    """The ``ArchonArgs`` methods ``stage_costs`` reads: layers 0-1 dense, 2-3 MoE (many params, few flops)."""

    def layer_param_count(self, i: int) -> int:
        return 100 if i < 2 else 1000

    def layer_flops_per_token(self, i: int) -> float:
        return 200.0 if i < 2 else 300.0


def test_stage_costs_by_params_flops_layers():
    args = _FakeArgs(n_layers=4, embed_param_count=50, head_param_count=60)
    assert stage_costs(args, "params") == ([100.0, 100.0, 1000.0, 1000.0], 50.0, 60.0)
    assert stage_costs(args, "flops") == ([200.0, 200.0, 300.0, 300.0], 0.0, 120.0)
    assert stage_costs(args, "layers") == ([1.0] * 4, 0.0, 0.0)
    assert balanced_split(args, 2, "params") == [range(3), range(3, 4)]
    assert balanced_split(args, 2, "layers") == [range(2), range(2, 4)]
    with pytest.raises(EngineError, match="balance"):
        stage_costs(args, "memory")
