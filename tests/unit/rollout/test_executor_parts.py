"""The rollout executor's pure parts: prompt order (data_source), admission and batch selection
(staleness), counters and histograms (stats)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import get_args, get_type_hints

import pytest

from areal_tasks.api.workflow import Trajectory
from areal_tasks.config.rollout import RolloutConfig
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.data_source import DataSource
from areal_tasks.rollout.staleness import STALENESS_BOUNDS, AdmissionRule, select_batch
from areal_tasks.rollout.stats import RolloutCounters, StalenessHistogram, batch_stats, staleness_of


def test_data_source_uses_a_seeded_permutation_per_epoch_and_cycles() -> None:
    data = list("abcdefg")
    src = DataSource(data, seed=5)
    got = [src.next() for _ in range(2 * len(data) + 1)]
    for epoch in (0, 1):
        order = list(range(len(data)))
        random.Random(5 * 1_000_003 + epoch).shuffle(order)
        chunk = got[epoch * len(data) : (epoch + 1) * len(data)]
        assert [pos for pos, _ in chunk] == [(epoch, i) for i in range(len(data))]
        assert [item for _, item in chunk] == [data[j] for j in order]
    assert got[-1][0] == (2, 0)
    plain = DataSource(data, seed=5, shuffle=False)
    assert [plain.next()[1] for _ in range(3)] == ["a", "b", "c"]


def test_data_source_state_round_trip_replays_pending_positions_first() -> None:
    src = DataSource(list(range(10)), seed=1)
    handed = [src.next() for _ in range(4)]
    state = json.loads(json.dumps(src.state_dict(pending=[handed[1][0], handed[3][0]])))
    other = DataSource(list(range(10)), seed=1)
    other.load_state_dict(state)
    assert [other.next() for _ in range(3)] == [handed[1], handed[3], src.next()]


def test_data_source_refuses_a_state_of_another_dataset() -> None:
    state = DataSource(list(range(10)), seed=1).state_dict()
    with pytest.raises(ConfigError, match="10 prompts"):
        DataSource(list(range(9)), seed=1).load_state_dict(state)
    with pytest.raises(ConfigError, match="empty"):
        DataSource([], seed=1)


def test_admission_budget_is_eta_plus_one_batches_ahead_of_the_trainer() -> None:
    rule = AdmissionRule(batch_size=8, group_size=2, max_concurrent=100, eta=0)
    kw = {"base_version": 0, "consumed": 0, "ready": 0, "in_flight": 0}
    assert rule.may_admit(version=0, running=6, **kw)
    assert not rule.may_admit(version=0, running=8, **kw)  # batch 0 is fully started: wait for version 1
    assert rule.may_admit(version=1, running=8, **kw)
    eta2 = AdmissionRule(batch_size=8, group_size=2, max_concurrent=100, eta=2)
    assert eta2.budget(version=3, base_version=1) == (2 + 3 - 1 + 1) * 8
    assert not eta2.may_admit(version=1, base_version=1, consumed=0, ready=10, running=14, in_flight=14)
    small = AdmissionRule(batch_size=8, group_size=2, max_concurrent=5, eta=9)
    assert small.may_admit(version=0, base_version=0, consumed=0, ready=0, running=4, in_flight=3)
    assert not small.may_admit(version=0, base_version=0, consumed=0, ready=0, running=4, in_flight=4)


@dataclass
class G:
    name: str
    deadline: int


def test_select_batch_takes_earliest_deadlines_in_completion_order() -> None:
    ready = [G("a", 3), G("b", 2), G("c", 3), G("d", 2)]
    groups, on_time = select_batch(ready, [], version=1, groups_per_batch=2)
    assert [g.name for g in groups or []] == ["b", "d"] and on_time
    assert select_batch(ready[:1], [], version=1, groups_per_batch=2) == (None, True)


def test_select_batch_waits_for_a_running_group_that_would_miss_its_deadline() -> None:
    # version 1, eta 1: a running group with deadline 1 must be in this batch
    ready = [G("late", 2), G("late2", 2)]
    assert select_batch(ready, [1], version=1, groups_per_batch=2) == (None, True)
    # deadline 2 running: one future batch (version 2) has room for it
    groups, on_time = select_batch(ready, [2], version=1, groups_per_batch=2)
    assert groups == ready and on_time
    # two groups due by version 2 still run: the next batch (version 2) can take them
    assert select_batch([G("x", 3), G("y", 3)], [2, 2], version=1, groups_per_batch=2)[0] is not None
    # three cannot all fit into that one batch of 2: this batch waits for one of them instead of taking x, y
    assert select_batch([G("x", 3), G("y", 3)], [2, 2, 2], version=1, groups_per_batch=2) == (None, True)


def test_select_batch_returns_late_batches_when_waiting_cannot_help() -> None:
    # the trainer jumped ahead: groups due at version 1 remain at version 3 and nothing earlier runs
    ready = [G("a", 1), G("b", 1), G("c", 1)]
    groups, on_time = select_batch(ready, [], version=3, groups_per_batch=2)
    assert [g.name for g in groups or []] == ["a", "b"] and not on_time


def test_select_batch_admission_bound_takes_completion_order_and_never_waits_for_running_groups() -> None:
    ready = [G("a", 3), G("b", 2), G("c", 3), G("d", 2)]
    groups, on_time = select_batch(ready, [], version=1, groups_per_batch=2, bound="admission")
    assert [g.name for g in groups or []] == ["a", "b"] and on_time
    # the sample bound waits here for the running group due at version 1; the admission bound does not
    late = [G("late", 2), G("late2", 2)]
    assert select_batch(late, [1], version=1, groups_per_batch=2) == (None, True)
    assert select_batch(late, [1], version=1, groups_per_batch=2, bound="admission") == (late, True)
    # groups past their deadline are returned as they come, and that is no broken promise (on_time)
    overdue = [G("x", 1), G("y", 4), G("z", 1)]
    groups, on_time = select_batch(overdue, [0], version=3, groups_per_batch=2, bound="admission")
    assert [g.name for g in groups or []] == ["x", "y"] and on_time
    assert select_batch(overdue[:1], [], version=3, groups_per_batch=2, bound="admission") == (None, True)


def test_select_batch_bounds_agree_when_all_deadlines_are_equal() -> None:
    # eta = 0: everything ready was admitted at the trainer's version, nothing else runs
    ready = [G(name, 4) for name in "qpsr"]
    for n in range(1, 5):
        assert select_batch(ready[:n], [], version=4, groups_per_batch=4) == select_batch(
            ready[:n], [], version=4, groups_per_batch=4, bound="admission"
        )
    assert select_batch(ready, [], version=4, groups_per_batch=4) == (ready, True)


def test_select_batch_refuses_an_unknown_bound() -> None:
    with pytest.raises(ValueError, match="bound='strict' must be one of 'sample', 'admission'"):
        select_batch([], [], version=0, groups_per_batch=1, bound="strict")  # type: ignore[arg-type]


def test_staleness_bounds_are_the_config_choices() -> None:
    assert get_args(get_type_hints(RolloutConfig)["staleness_bound"]) == STALENESS_BOUNDS == ("sample", "admission")
    assert RolloutConfig().staleness_bound == "sample"


def traj(versions: list[int], reward: float = 1.0) -> Trajectory:
    n = len(versions)
    return Trajectory(
        input_ids=[1] + [2] * n,
        loss_mask=[0] + [1] * n,
        logprobs=[0.0] * (n + 1),
        versions=[-1, *versions],
        reward=reward,
        prompt_len=1,
    )


def test_stats_helpers() -> None:
    assert staleness_of(traj([3, 4]), version=5) == 2
    assert staleness_of(traj([]), version=5) is None
    stats = batch_stats([traj([3, 4], 1.0), traj([5], 0.0)], version=5, wait_s=0.5)
    assert stats["staleness_max"] == 2.0 and stats["staleness_mean"] == 1.0 and stats["reward_mean"] == 0.5
    assert all(isinstance(v, float) for v in stats.values())
    hist = StalenessHistogram()
    hist.add([0, 1, 1])
    restored = StalenessHistogram()
    restored.load_state(json.loads(json.dumps(hist.to_state())))
    assert restored.as_dict() == {0: 1, 1: 2}
    counters = RolloutCounters(admitted=4, accepted=2)
    assert RolloutCounters.from_dict({**counters.to_dict(), "unknown": 1}) == counters
    older = {k: v for k, v in counters.to_dict().items() if k != "late_samples"}  # a state from before the key
    assert RolloutCounters.from_dict(older) == counters and counters.late_samples == 0
