"""One contract for both implementations of the executor protocol: the in-thread ``RolloutExecutor``
and the rollout process's ``RemoteExecutor`` (the same executor, driven over a pipe).

Each test runs against both, through :class:`~areal_tasks.api.rollout.RolloutExecutorProtocol` only:
the signatures match the protocol's; a training run (start, batches of whole groups, weight swaps,
pause / update / resume, versions, stats) gives the same answers; errors keep their type; a state
round trip works before start; stop is final and idempotent. The executor runs over the fakes.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from areal_tasks.api.rollout import EXECUTOR_METHODS, RolloutExecutorProtocol
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.rollout.executor import RolloutExecutor
from areal_tasks.rollout.process import COMMANDS, RemoteExecutor, RolloutProcess
from tests.unit.rollout.fakes import build_fake_side, build_heap_reporting_side

T = 30.0
SETTINGS: dict[str, Any] = {
    "batch_size": 8,
    "group_size": 2,
    "max_concurrent_rollouts": 16,
    "max_head_offpolicyness": 1,
    "max_failure_rate": 0.5,
    "failure_window": 16,
    "seed": 3,
    "dataset": list(range(40)),
}


@pytest.fixture(params=["thread", "process"])
def executor(request: pytest.FixtureRequest) -> Iterator[RolloutExecutorProtocol]:
    if request.param == "thread":
        side = build_fake_side(SETTINGS)
        try:
            yield side.executor
        finally:
            side.close()
    else:
        process = RolloutProcess.spawn(build_fake_side, (SETTINGS,), timeout_s=120)
        try:
            yield process.executor
        finally:
            process.close()


def meta(version: int) -> WeightUpdateMeta:
    return WeightUpdateMeta(type="disk", version=version, path="/nowhere")


def test_the_command_table_and_the_proxy_are_the_protocol() -> None:
    public = [n for n, m in vars(RolloutExecutorProtocol).items() if inspect.isfunction(m) and not n.startswith("_")]
    assert list(EXECUTOR_METHODS) == public and len(public) == 14
    assert {n.removeprefix("executor.") for n in COMMANDS if n.startswith("executor.")} == set(EXECUTOR_METHODS)
    for name, returns in EXECUTOR_METHODS.items():
        assert COMMANDS[f"executor.{name}"] is (returns == "value")
        declared = inspect.signature(getattr(RolloutExecutorProtocol, name))
        for implementation in (RolloutExecutor, RemoteExecutor):
            params = inspect.signature(getattr(implementation, name)).parameters
            assert [(p.name, p.default) for p in params.values()] == [
                (p.name, p.default) for p in declared.parameters.values()
            ], f"{implementation.__name__}.{name}"


def test_both_are_the_protocol(executor: RolloutExecutorProtocol) -> None:
    assert isinstance(executor, RolloutExecutorProtocol)


def test_a_training_run_through_the_protocol(executor: RolloutExecutorProtocol) -> None:
    assert executor.state_dict()["version"] == 0
    assert executor.start() is executor
    assert executor.start() is executor  # idempotent
    for version in range(3):
        batch = executor.prepare_batch(timeout_s=T)
        assert len(batch) == 8
        for i in range(0, 8, 2):
            assert batch[i].metadata["rollout_group"] == batch[i + 1].metadata["rollout_group"]
        assert executor.last_batch_stats()["n_samples"] == 8.0
        parts = executor.swap_weights(meta(version + 1), None, version + 1, "abort")
        assert set(parts) == {"queue", "pause", "transfer", "resume"}
        assert executor.stats()["version"] == version + 1
    executor.pause("abort")
    assert executor.stats()["paused"] is True
    executor.update_weights(meta(4))
    executor.resume()
    executor.set_version(4)
    assert len(executor.prepare_batch(timeout_s=T)) == 8
    assert executor.destroy_weight_groups() == []  # an engine without collective groups
    stats = executor.stats()
    assert stats["consumed_batches"] == 4 and stats["version"] == 4 and stats["paused"] is False
    assert executor.stop() is None
    executor.stop()
    with pytest.raises(RolloutError, match="stopped"):
        executor.prepare_batch(timeout_s=T)
    assert executor.stats()["consumed_batches"] == 4  # still readable


def test_errors_keep_their_type_and_the_executor_goes_on(executor: RolloutExecutorProtocol) -> None:
    with pytest.raises(ConfigError, match="version=-1"):
        executor.set_version(-1)
    with pytest.raises(RolloutError, match="start"):
        executor.prepare_batch(timeout_s=1)
    executor.start()
    with pytest.raises(RolloutError, match="before start"):
        executor.load_state_dict(executor.state_dict())
    assert len(executor.prepare_batch(timeout_s=T)) == 8


def test_a_state_loads_before_start(executor: RolloutExecutorProtocol) -> None:
    state = executor.state_dict()
    state["version"] = 5
    assert executor.load_state_dict(state) is None
    assert executor.stats()["version"] == 5
    executor.start()
    assert len(executor.prepare_batch(timeout_s=T)) == 8


@pytest.mark.parametrize("where", ["thread", "process"])
def test_mark_trained_writes_the_session_trace_where_the_executor_runs(where: str, tmp_path: Any) -> None:
    settings = {**SETTINGS, "sessions_file": str(tmp_path / "sessions.jsonl")}
    side: Any = build_fake_side(settings) if where == "thread" else RolloutProcess.spawn(build_fake_side, (settings,))
    try:
        executor = side.executor
        executor.start()
        for step in (1, 2):
            executor.prepare_batch(timeout_s=T)
            executor.swap_weights(meta(step), None, step, "abort")
            assert executor.mark_trained(step) is None
    finally:
        side.close()
    from areal_tasks.trace.queries import load_sessions

    lines = load_sessions(tmp_path)
    trained = [s["trained_step"] for s in lines if s["status"] == "accepted"]
    assert sorted(trained) == [1] * 8 + [2] * 8
    assert {s["status"] for s in lines} <= {"accepted", "dropped"}


def test_the_rollout_child_freezes_its_start_up_heap() -> None:
    """The child's built side (its imports, executor, workflow) is out of the collector's sight, so
    its full collections traverse only what serving made (``gc_heap.py``); this process is not frozen."""
    import gc

    process = RolloutProcess.spawn(build_heap_reporting_side, (SETTINGS,), timeout_s=120)
    try:
        heap = process.evaluate()
    finally:
        process.close()
    assert heap["gc/frozen_objects"] > 10_000, heap
    assert heap["gc/tracked_objects"] < heap["gc/frozen_objects"] / 4, heap
    assert gc.get_freeze_count() == 0
