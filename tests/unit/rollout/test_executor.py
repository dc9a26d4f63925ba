"""RolloutExecutor end to end on fakes: batch shape, bounded staleness (both bounds), concurrency,
rejection and filtering, failure handling, pause/resume, checkpoint round trips, stop and timeouts.

The fakes sleep a few milliseconds per request (seeded); no test asserts on elapsed time. A test
plays the trainer: ``prepare_batch``, then bump the engine's version (as its weight update would),
then ``set_version``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.config.rollout import RolloutConfig
from areal_tasks.errors import ConfigError, RolloutError, TrajectoryError
from areal_tasks.rollout.executor import RolloutExecutor
from tests.unit.rollout.fakes import FakeWorkflow, GatedWorkflow, TimedEngine, long_tail_delay

T = 30.0  # prepare_batch timeout: generous, only there so a bug fails instead of hanging


def make(engine: TimedEngine | None = None, workflow: FakeWorkflow | None = None, **kw: Any) -> RolloutExecutor:
    settings: dict[str, Any] = {
        "batch_size": 8,
        "group_size": 2,
        "max_concurrent_rollouts": 16,
        "max_head_offpolicyness": 1,
        "max_failure_rate": 0.5,
        "failure_window": 16,
        "seed": 3,
        "dataset": list(range(40)),
    }
    settings.update(kw)
    return RolloutExecutor(engine=engine or TimedEngine(), workflow=workflow or FakeWorkflow(), **settings)


def step(ex: RolloutExecutor, engine: TimedEngine) -> None:
    """What the trainer does after training on a batch: new weights to the engine, then the new version."""
    engine.set_version(engine.version + 1)
    ex.set_version(engine.version)


def groups_of(batch: list[Any], group_size: int) -> list[int]:
    """The group ids of a batch, checking every group is whole, contiguous and of one prompt."""
    assert len(batch) % group_size == 0
    ids = []
    for start in range(0, len(batch), group_size):
        chunk = batch[start : start + group_size]
        assert len({t.metadata["rollout_group"] for t in chunk}) == 1
        assert len({t.metadata["item"] for t in chunk}) == 1
        ids.append(chunk[0].metadata["rollout_group"])
    assert len(set(ids)) == len(ids), "a group appears twice in one batch"
    return ids


def test_batches_hold_exactly_batch_size_samples_in_whole_contiguous_groups() -> None:
    engine = TimedEngine(seed=1)
    seen: set[int] = set()
    with make(engine, batch_size=12, group_size=3, max_concurrent_rollouts=9) as ex:
        for _ in range(5):
            batch = ex.prepare_batch(timeout_s=T)
            assert len(batch) == 12
            ids = groups_of(batch, 3)
            assert not seen & set(ids), "a group was returned twice"
            seen.update(ids)
            step(ex, engine)
        stats = ex.stats()
    assert stats["consumed_batches"] == 5 and stats["consumed_samples"] == 60
    assert ex.last_batch_stats()["n_samples"] == 12


def test_eta_zero_is_synchronous() -> None:
    engine = TimedEngine(seed=2)
    with make(engine, max_head_offpolicyness=0, max_concurrent_rollouts=16) as ex:
        for v in range(5):
            batch = ex.prepare_batch(timeout_s=T)
            assert {t.metadata["rollout_admit_version"] for t in batch} == {v}
            assert {t.metadata["start_version"] for t in batch} == {v}
            assert {t.oldest_version() for t in batch} == {v}
            stats = ex.stats()
            # nothing for the next batch is started before the trainer moves on
            assert stats["admitted"] == (v + 1) * 8 and stats["in_flight"] == 0 and stats["ready"] == 0
            assert stats["last_batch_staleness_max"] == 0
            step(ex, engine)
        stats = ex.stats()
    assert stats["staleness_hist"] == {0: 40}


def test_eta_two_allows_staleness_up_to_two_with_long_tails() -> None:
    engine = TimedEngine(delay=long_tail_delay(), seed=4)
    with make(engine, max_head_offpolicyness=2, batch_size=8, group_size=2, max_concurrent_rollouts=32) as ex:
        for v in range(10):
            batch = ex.prepare_batch(timeout_s=T)
            groups_of(batch, 2)
            assert all(v - t.metadata["rollout_admit_version"] <= 2 for t in batch)
            assert all(v - t.oldest_version() <= 2 for t in batch)
            step(ex, engine)
        stats = ex.stats()
    hist = stats["staleness_hist"]
    assert sum(hist.values()) == 80
    assert max(hist) <= 2
    assert max(hist) > 0, "eta=2 should let the executor run ahead"
    assert stats["late_batches"] == 0


def slow_first_group(**kw: Any) -> tuple[RolloutExecutor, TimedEngine, GatedWorkflow]:
    """Batches of 2 groups of 2, prompts in dataset order; the first group (item 0) is held until released."""
    engine = TimedEngine(seed=12)
    workflow = GatedWorkflow(hold=lambda item: item == 0)
    return make(engine, workflow, batch_size=4, group_size=2, shuffle=False, **kw), engine, workflow


def group_ids(batch: list[Any]) -> set[int]:
    return {t.metadata["rollout_group"] for t in batch}


def test_sample_bound_waits_for_a_slow_group_whose_deadline_has_come() -> None:
    ex, engine, workflow = slow_first_group(max_head_offpolicyness=1)
    with ex:
        # version 0: four groups admitted, all due by version 1; two fast ones make this batch
        assert 0 not in group_ids(ex.prepare_batch(timeout_s=T))
        step(ex, engine)
        # version 1: the slow group is due now, so the batch waits for it
        with pytest.raises(RolloutError, match="timed out"):
            ex.prepare_batch(timeout_s=0.2)
        workflow.release()
        batch = ex.prepare_batch(timeout_s=T)
        assert 0 in group_ids(batch) and all(1 - t.oldest_version() <= 1 for t in batch)
        step(ex, engine)
        stats = ex.stats()
    assert stats["staleness_bound"] == "sample"
    assert stats["late_samples"] == 0 and stats["late_batches"] == 0
    assert max(stats["staleness_hist"]) <= 1


def test_admission_bound_returns_fast_groups_first_and_the_slow_one_late(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="areal_tasks.rollout.executor")
    ex, engine, workflow = slow_first_group(max_head_offpolicyness=1, staleness_bound="admission")
    with ex:
        for _ in range(2):  # versions 0 and 1: the slow group is due at 1, but no batch waits for it
            assert 0 not in group_ids(ex.prepare_batch(timeout_s=T))
            step(ex, engine)
        workflow.release()
        for version in range(2, 8):  # noqa: B007 - read after the loop: the version whose batch held the group
            batch = ex.prepare_batch(timeout_s=T)
            step(ex, engine)
            if 0 in group_ids(batch):
                break
        else:
            pytest.fail("the slow group was never returned after its release")
        slow = [t for t in batch if t.metadata["rollout_group"] == 0]
        assert len(slow) == 2 and {version - t.oldest_version() for t in slow} == {version}  # staler than eta=1
        assert ex.last_batch_stats()["late_samples"] >= 2
        stats = ex.stats()
    assert stats["staleness_bound"] == "admission"
    assert stats["late_samples"] >= 2 and stats["late_batches"] == 0
    assert sum(n for s, n in stats["staleness_hist"].items() if s > 1) >= 2
    assert stats["admitted"] <= stats["consumed_samples"] + 2 * 4  # admission still bounded to eta + 1 batches
    assert not [r for r in caplog.records if "max_head_offpolicyness" in r.getMessage()]


def test_eta_zero_gives_the_same_batches_under_both_bounds() -> None:
    def run(bound: str) -> tuple[list[set[int]], dict[str, Any]]:
        ex, engine, workflow = slow_first_group(max_head_offpolicyness=0, staleness_bound=bound)
        batches = []
        with ex:
            # the budget is this one batch: both bounds wait for the slow group
            with pytest.raises(RolloutError, match="timed out"):
                ex.prepare_batch(timeout_s=0.2)
            workflow.release()
            for _ in range(4):
                batches.append(group_ids(ex.prepare_batch(timeout_s=T)))
                step(ex, engine)
            return batches, ex.stats()

    sample, sample_stats = run("sample")
    admission, admission_stats = run("admission")
    assert sample == admission == [{0, 1}, {2, 3}, {4, 5}, {6, 7}]
    for stats in (sample_stats, admission_stats):
        assert stats["staleness_hist"] == {0: 16}
        assert stats["late_samples"] == 0 and stats["late_batches"] == 0


def test_max_concurrent_rollouts_is_never_exceeded() -> None:
    engine = TimedEngine(seed=5)
    workflow = FakeWorkflow()
    with make(engine, workflow, batch_size=8, group_size=2, max_concurrent_rollouts=5, max_head_offpolicyness=4) as ex:
        for _ in range(6):
            ex.prepare_batch(timeout_s=T)
            assert ex.stats()["in_flight"] <= 5
            step(ex, engine)
    # episodes, not groups, count: a group may start while the last episode of another still runs
    assert 4 <= workflow.max_running <= 5
    assert engine.max_in_flight <= 5


def test_rejected_and_filtered_groups_are_replaced_and_counted() -> None:
    engine = TimedEngine(seed=6)
    workflow = FakeWorkflow(reject=lambda item, n: item % 5 == 0)
    ex = make(engine, workflow, group_filter=lambda group: group[0].metadata["item"] % 3 != 0)
    with ex:
        for _ in range(4):
            batch = ex.prepare_batch(timeout_s=T)
            assert len(batch) == 8
            groups_of(batch, 2)
            items = {t.metadata["item"] for t in batch}
            assert not {i for i in items if i % 5 == 0 or i % 3 == 0}
            step(ex, engine)
        stats = ex.stats()
    assert stats["rejected"] > 0 and stats["filtered"] > 0
    assert stats["rejected"] % 2 == 0 and stats["filtered"] % 2 == 0
    assert stats["failed"] == 0
    assert stats["rejection_rate"] > 0
    assert stats["admitted"] == stats["accepted"] + stats["rejected"] + stats["filtered"] + stats["running_samples"]


def test_failures_below_the_rate_are_tolerated() -> None:
    engine = TimedEngine(seed=7)
    workflow = FakeWorkflow(fail=lambda item, n: n % 9 == 4, invalid=lambda item, n: n % 13 == 6)
    with make(engine, workflow, max_failure_rate=0.5, failure_window=16) as ex:
        for _ in range(5):
            assert len(ex.prepare_batch(timeout_s=T)) == 8
            step(ex, engine)
        stats = ex.stats()
    assert stats["failed"] > 0
    assert stats["rejected"] >= 2 * stats["failed"]  # a failure rejects its whole group
    assert stats["error"] is None


def test_failures_above_the_rate_fail_the_executor_with_the_cause() -> None:
    engine = TimedEngine(seed=8)
    workflow = FakeWorkflow(fail=lambda item, n: item % 10 != 0)
    with make(engine, workflow, max_failure_rate=0.5, failure_window=8) as ex:
        with pytest.raises(RolloutError, match=r"of the last \d+ episodes failed; last error: ValueError") as info:
            for _ in range(10):
                ex.prepare_batch(timeout_s=T)
                step(ex, engine)
        assert isinstance(info.value.__cause__, ValueError)
        assert "max_failure_rate" in str(info.value)
        with pytest.raises(RolloutError):  # stays failed
            ex.prepare_batch(timeout_s=T)
        stats = ex.stats()
    assert stats["error"] and stats["in_flight"] == 0


def test_invalid_trajectories_count_as_failures() -> None:
    workflow = FakeWorkflow(invalid=lambda item, n: True)
    with make(workflow=workflow, max_failure_rate=0.2, failure_window=8) as ex, pytest.raises(RolloutError) as info:
        ex.prepare_batch(timeout_s=T)
    assert isinstance(info.value.__cause__, TrajectoryError)


def test_a_raising_group_filter_fails_the_executor() -> None:
    def broken(group: list[Any]) -> bool:
        raise KeyError("reward")

    with make(group_filter=broken) as ex, pytest.raises(RolloutError, match="group_filter raised KeyError") as info:
        ex.prepare_batch(timeout_s=T)
    assert isinstance(info.value.__cause__, KeyError)


def test_pause_stops_admission_and_resume_continues() -> None:
    engine = TimedEngine(seed=9)
    workflow = FakeWorkflow()
    with make(engine, workflow, max_head_offpolicyness=1) as ex:
        ex.prepare_batch(timeout_s=T)
        ex.pause()
        assert engine.pause_calls == ["abort"] and engine.paused
        assert ex.stats()["paused"] is True
        admitted = ex.stats()["admitted"]
        ex.set_version(1)  # more budget, but paused: nothing new starts
        time.sleep(0.05)
        assert ex.stats()["admitted"] == admitted
        ex.update_weights(WeightUpdateMeta(type="disk", version=1, path="/nowhere"))
        assert engine.updates == [1] and engine.version == 1
        ex.resume()
        assert engine.resume_calls == 1 and not engine.paused
        for _ in range(3):
            assert len(ex.prepare_batch(timeout_s=T)) == 8
            step(ex, engine)
        assert ex.stats()["admitted"] > admitted


def test_swap_weights_is_pause_update_version_resume_in_one_call() -> None:
    engine = TimedEngine(seed=11)
    with make(engine, max_head_offpolicyness=0) as ex:
        assert len(ex.prepare_batch(timeout_s=T)) == 8
        parts = ex.swap_weights(WeightUpdateMeta(type="disk", version=1, path="/nowhere"), None, 1, "in_place")
        assert engine.pause_calls == ["in_place"] and engine.updates == [1] and engine.resume_calls == 1
        assert not engine.paused and ex.stats()["paused"] is False
        assert set(parts) == {"queue", "pause", "transfer", "resume"} and all(v >= 0 for v in parts.values())
        batch = ex.prepare_batch(timeout_s=T)  # eta = 0: only the new version's budget admits this batch
        assert len(batch) == 8 and {t.versions[-1] for t in batch} == {1}
        with pytest.raises(ConfigError, match="version"):
            ex.swap_weights(WeightUpdateMeta(type="disk", version=2, path="/nowhere"), None, -1)


class ControlEngine(TimedEngine):
    """A TimedEngine whose swap may run on any event loop; it records the thread each swap ran on."""

    control_from_any_loop = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.swap_threads: list[str] = []

    async def swap_weights(self, meta: Any, buckets: Any = None, mode: Any = "abort") -> dict[str, float]:
        self.swap_threads.append(threading.current_thread().name)
        self.updates.append(meta.version)
        self.version = meta.version
        return {"pause": 0.0, "transfer": 0.0, "resume": 0.0}


class LoopBlockingWorkflow(FakeWorkflow):
    """Once ``arm`` is set, the next episode step blocks the executor's event loop (a synchronous
    wait, as a loop kept busy would) until ``unblock``."""

    def __init__(self) -> None:
        super().__init__()
        self.arm = threading.Event()
        self.blocking = threading.Event()
        self.unblock = threading.Event()

    async def arun_episode(self, engine: Any, data: Any) -> Any:
        while not self.arm.is_set():
            await asyncio.sleep(0.001)
        if not self.blocking.is_set():
            self.blocking.set()
            self.unblock.wait(T)  # deliberately blocks the loop
        return await super().arun_episode(engine, data)


def test_swap_weights_runs_on_a_control_loop_while_the_episodes_loop_is_blocked() -> None:
    engine, workflow = ControlEngine(seed=12), LoopBlockingWorkflow()
    with make(engine, workflow) as ex:
        workflow.arm.set()
        assert workflow.blocking.wait(T)
        done: list[dict[str, float]] = []
        swap = threading.Thread(
            target=lambda: done.append(
                ex.swap_weights(WeightUpdateMeta(type="disk", version=1, path="/nowhere"), None, 1, "in_place")
            )
        )
        swap.start()
        swap.join(T)  # the episodes' loop is still blocked: the swap did not need it
        blocked_throughout = not workflow.unblock.is_set()
        workflow.unblock.set()
        assert done and blocked_throughout
        assert set(done[0]) == {"queue", "pause", "transfer", "resume"}
        assert engine.swap_threads == [f"rollout-control-{id(ex):x}"] and engine.updates == [1]
        assert ex.stats()["version"] == 1 and ex.stats()["paused"] is False  # applied before this call
        assert len(ex.prepare_batch(timeout_s=T)) == 8
    assert engine.aclose_calls == 2  # the episodes' loop and the control loop each closed their connections


class HangingSwapEngine(ControlEngine):
    """A ControlEngine whose swap never finishes (a server that does not answer)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.swapping = threading.Event()

    async def swap_weights(self, meta: Any, buckets: Any = None, mode: Any = "abort") -> dict[str, float]:
        self.swapping.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_stop_during_a_swap_on_the_control_loop_fails_the_swap_clearly() -> None:
    engine = HangingSwapEngine(seed=13)
    ex = make(engine).start()
    errors: list[BaseException] = []

    def swap() -> None:
        try:
            ex.swap_weights(WeightUpdateMeta(type="disk", version=1, path="/nowhere"), None, 1, "in_place")
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)

    caller = threading.Thread(target=swap)
    caller.start()
    assert engine.swapping.wait(T)
    ex.stop()
    caller.join(T)
    assert len(errors) == 1 and isinstance(errors[0], RolloutError)
    assert "was closed while this call ran" in str(errors[0])


def test_pause_before_start_starts_paused() -> None:
    engine = TimedEngine(seed=10)
    ex = make(engine)
    try:
        ex.pause()
        ex.set_version(0)
        ex.start()
        assert ex.stats()["admitted"] == 0
        with pytest.raises(RolloutError, match="paused: call resume"):
            ex.prepare_batch(timeout_s=0.2)
        ex.resume()
        assert len(ex.prepare_batch(timeout_s=T)) == 8
    finally:
        ex.stop()


def test_state_dict_round_trip_continues_with_the_next_prompts() -> None:
    def run(ex: RolloutExecutor, engine: TimedEngine, n: int) -> list[set[int]]:
        out = []
        for _ in range(n):
            out.append({t.metadata["item"] for t in ex.prepare_batch(timeout_s=T)})
            step(ex, engine)
        return out

    kw: dict[str, Any] = {
        "dataset": list(range(6)),
        "batch_size": 4,
        "group_size": 2,
        "max_head_offpolicyness": 0,
        "seed": 11,
    }
    ref_engine = TimedEngine(seed=1)
    with make(ref_engine, **kw) as ref:
        reference = run(ref, ref_engine, 5)  # 3 batches per epoch: crosses into the second epoch

    engine_a = TimedEngine(seed=2)
    with make(engine_a, **kw) as a:
        first = run(a, engine_a, 2)
        state = json.loads(json.dumps(a.state_dict()))
    assert state["version"] == 2 and state["counters"]["consumed_batches"] == 2

    engine_b = TimedEngine(seed=3, version=2)
    b = make(engine_b, **kw)
    b.load_state_dict(state)
    with b:
        second = run(b, engine_b, 3)
        stats = b.stats()
    assert first + second == reference
    assert stats["consumed_batches"] == 5 and stats["version"] == 5


def test_a_state_without_late_samples_loads() -> None:
    with make(max_head_offpolicyness=0, staleness_bound="admission") as a:
        a.prepare_batch(timeout_s=T)
        state = json.loads(json.dumps(a.state_dict()))
    assert state["counters"].pop("late_samples") == 0  # as written before the counter existed
    b = make(max_head_offpolicyness=0, staleness_bound="admission")
    b.load_state_dict(state)
    stats = b.stats()
    assert stats["late_samples"] == 0 and stats["consumed_samples"] == 8
    b.stop()


def test_state_dict_replays_groups_that_were_not_consumed() -> None:
    kw: dict[str, Any] = {"batch_size": 4, "group_size": 2, "max_head_offpolicyness": 2, "max_concurrent_rollouts": 16}
    engine_a = TimedEngine(seed=4)
    with make(engine_a, **kw) as a:
        a.prepare_batch(timeout_s=T)
        state = json.loads(json.dumps(a.state_dict()))
    pending = state["data"]["pending"]
    assert pending, "eta=2 keeps groups running or ready beyond the batch"
    counters = state["counters"]
    assert counters["admitted"] == counters["accepted"] + counters["rejected"] + counters["filtered"] == 4

    workflow_b = FakeWorkflow()
    b = make(TimedEngine(seed=5, version=1), workflow_b, **kw)
    b.load_state_dict(state)
    b.set_version(1)
    with b:
        b.prepare_batch(timeout_s=T)
        probe = make(**kw)  # the same seed and dataset: maps positions to items
        expected = [probe._data.item_at(tuple(p)) for p in pending]
        started = workflow_b.calls[: 2 * len(pending)]
    assert started[::2] == expected and started[1::2] == expected


def test_stop_cancels_in_flight_episodes_leaves_no_thread_and_is_idempotent() -> None:
    engine = TimedEngine()
    workflow = FakeWorkflow(block=True)
    ex = make(engine, workflow).start()
    thread = ex._thread
    assert thread is not None and thread.is_alive() and ex.is_running
    deadline = time.monotonic() + T
    while workflow.running < 16 and time.monotonic() < deadline:
        time.sleep(0.01)
    ex.stop()
    ex.stop()
    assert not thread.is_alive() and not ex.is_running
    assert workflow.cancelled == 16 and workflow.running == 0
    assert engine.aclose_calls == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("rollout-executor")]
    assert ex.stats()["admitted"] == 16  # still readable
    with pytest.raises(RolloutError, match="stopped"):
        ex.prepare_batch(timeout_s=T)
    with pytest.raises(RolloutError, match="cannot be restarted"):
        ex.start()


def test_stop_wakes_a_waiting_prepare_batch() -> None:
    ex = make(workflow=FakeWorkflow(block=True)).start()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            ex.prepare_batch(timeout_s=T)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.05)
    ex.stop()
    waiter.join(T)
    assert not waiter.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], RolloutError)


def test_prepare_batch_timeout_names_the_counters() -> None:
    engine = TimedEngine()
    with make(engine, max_head_offpolicyness=0) as ex:
        ex.prepare_batch(timeout_s=T)
        # the trainer forgot set_version: the staleness budget of version 0 is used up
        with pytest.raises(RolloutError) as info:
            ex.prepare_batch(timeout_s=0.2)
    text = str(info.value)
    for word in ("in flight=0", "ready=0", "admitted=8", "capacity=0", "set_version"):
        assert word in text, text


def test_prepare_batch_needs_start() -> None:
    with pytest.raises(RolloutError, match="start"):
        make().prepare_batch(timeout_s=1)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"batch_size": 7, "group_size": 2}, "multiple of group_size"),
        ({"max_concurrent_rollouts": 1, "group_size": 2}, "max_concurrent_rollouts=1 must be >= group_size=2"),
        ({"max_head_offpolicyness": -1}, "max_head_offpolicyness"),
        ({"staleness_bound": "strict"}, "staleness_bound='strict' must be one of 'sample', 'admission'"),
        ({"max_failure_rate": 1.5}, "max_failure_rate"),
        ({"dataset": []}, "empty"),
    ],
)
def test_invalid_settings_are_refused(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        make(**overrides)


def test_from_config_takes_the_rollout_section() -> None:
    cfg = RolloutConfig(
        group_size=4,
        max_concurrent_rollouts=12,
        max_head_offpolicyness=3,
        max_failure_rate=0.25,
        staleness_bound="admission",
    )
    ex = RolloutExecutor.from_config(
        cfg, engine=TimedEngine(), workflow=FakeWorkflow(), dataset=[1, 2, 3], batch_size=8, seed=0, version=5
    )
    assert (ex.group_size, ex.batch_size, ex.max_head_offpolicyness, ex.staleness_bound) == (4, 8, 3, "admission")
    assert ex.stats()["version"] == 5 and ex.stats()["capacity"] == 12 and ex.stats()["staleness_bound"] == "admission"
    ex.stop()
