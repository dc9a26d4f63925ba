"""The session trace: the recorder on its own, and fed by a real executor over the rollout fakes.

A run of the executor (eta=1, a rejecting workflow, a group filter, a failing item) with a session
file must give one line per admitted episode, each with the schema's keys: accepted ones with the
step that trained them and the staleness the executor counted, rejected and failed ones with their
reason, and what was in flight at the stop dropped. The recorder's own rules (a rejected episode
written only once its task ended, a partial last line cut off, close drops the rest) and the
per-call facts (a call aborted across a weight update) are tested directly.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.api.inference import ModelRequest, ModelResponse, SamplingParams
from areal_tasks.api.workflow import Trajectory
from areal_tasks.errors import RolloutError
from areal_tasks.rollout.episodes import EpisodeEngine, EpisodeId
from areal_tasks.rollout.executor import RolloutExecutor
from areal_tasks.rollout.stats import staleness_of
from areal_tasks.trace.queries import load_sessions
from areal_tasks.trace.sessions import SessionRecorder, bind, current_session, note_rejection, timed_reward
from tests.unit.rollout.fakes import FakeWorkflow, TimedEngine, long_tail_delay

T = 30.0

SCHEMA: dict[str, Any] = {
    "episode": str,
    "group": str,
    "position": list,
    "sample": int,
    "admitted_t": float,
    "admitted_version": int,
    "calls": list,
    "reward": (float, type(None)),
    "reward_t0": (float, type(None)),
    "reward_t1": (float, type(None)),
    "status": str,
    "reason": (str, type(None)),
    "trained_step": (int, type(None)),
    "staleness": (int, type(None)),
    "n_output_tokens": int,
    "end_t": float,
}
CALL_SCHEMA: dict[str, Any] = {
    "t0": float,
    "t1": float,
    "in_tokens": int,
    "out_tokens": int,
    "version_start": int,
    "version_end": int,
    "aborted": int,
    "stop_reason": str,
}


def check_schema(line: dict[str, Any]) -> None:
    for key, kind in SCHEMA.items():
        assert isinstance(line[key], kind), (key, line[key])
    assert line["status"] in ("accepted", "rejected", "failed", "dropped")
    assert len(line["position"]) == 2
    for call in line["calls"]:
        for key, kind in CALL_SCHEMA.items():
            assert isinstance(call[key], kind), (key, call)
        assert call["t0"] <= call["t1"]


def make(path: Path | None, engine: TimedEngine | None = None, workflow: FakeWorkflow | None = None, **kw: Any) -> Any:
    """An executor over the fakes writing its session trace to ``path`` (``kw`` overrides the settings)."""
    settings: dict[str, Any] = {
        "dataset": list(range(20)),
        "batch_size": 4,
        "group_size": 2,
        "max_concurrent_rollouts": 8,
        "max_head_offpolicyness": 1,
        "max_failure_rate": 1.0,
        "seed": 1,
        "sessions_file": path,
        **kw,
    }
    return RolloutExecutor(engine=engine or TimedEngine(), workflow=workflow or FakeWorkflow(), **settings)


class NotingWorkflow(FakeWorkflow):
    """A FakeWorkflow that says why it rejects and scores through a timed reward."""

    async def arun_episode(self, engine: Any, data: Any) -> Trajectory | None:
        traj = await super().arun_episode(engine, data)
        if traj is None:
            note_rejection("empty output")
            return None
        traj.reward = await timed_reward(self._reward)(traj.reward)
        return traj

    @staticmethod
    async def _reward(value: float) -> float:
        await asyncio.sleep(0)
        return value


def test_a_run_of_the_executor_gives_one_final_line_per_admitted_episode(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    workflow = NotingWorkflow(reject=lambda item, n: item % 7 == 3, fail=lambda item, n: item % 6 == 2)
    executor = make(
        path,
        TimedEngine(delay=long_tail_delay(), seed=4),
        workflow,
        dataset=list(range(60)),
        batch_size=8,
        max_concurrent_rollouts=16,
        seed=2,
        group_filter=lambda group: group[0].metadata["item"] % 4 != 1,
    )
    expected: dict[str, int | None] = {}
    batch_staleness_max = []
    with executor:
        for step in range(1, 5):
            batch = executor.prepare_batch(timeout_s=T)
            version = executor.stats()["version"]
            for traj in batch:
                epoch, index, sample = traj.metadata["episode"]["id"]
                expected[f"{epoch}.{index}.{sample}"] = staleness_of(traj, version)
            batch_staleness_max.append(executor.last_batch_stats()["staleness_max"])
            executor.swap_weights(_meta(version + 1), None, version + 1)
            executor.mark_trained(step)
            if step == 2:  # flushed at the step boundary: the trained lines are on disk already
                assert len(load_sessions(path)) >= 16
    # counted once stopped: until then the executor goes on admitting episodes, each of which gets
    # its final line when it ends or when the stop drops it (a CI run admitted 4 more after an
    # earlier snapshot of the counts)
    stats = executor.stats()
    lines = load_sessions(tmp_path)  # the run directory works too
    for line in lines:
        check_schema(line)
    assert len({line["episode"] for line in lines}) == len(lines) == stats["admitted"]
    accepted = [line for line in lines if line["status"] == "accepted"]
    assert len(accepted) == 32 == stats["consumed_samples"]
    for line in accepted:
        key = ".".join(str(x) for x in [*line["position"], line["sample"]])
        assert line["staleness"] == expected[key]
        assert line["trained_step"] in (1, 2, 3, 4)
        assert line["reward"] is not None and line["reward_t0"] <= line["reward_t1"] <= line["end_t"]
        assert line["calls"] and line["n_output_tokens"] == sum(c["out_tokens"] for c in line["calls"])
        assert line["admitted_t"] <= line["calls"][0]["t0"]
    by_step: dict[int, list[int]] = {}
    for line in accepted:
        by_step.setdefault(line["trained_step"], []).append(line["staleness"])
    assert [max(by_step[s]) for s in range(1, 5)] == batch_staleness_max
    assert any(line["staleness"] > 0 for line in accepted)  # eta=1: some samples are one version old
    reasons = {line["reason"] for line in lines if line["status"] == "rejected"}
    assert "empty output" in reasons
    assert any(r.startswith("group filter: ") for r in reasons)
    assert any(r.startswith("group rejected: sample ") for r in reasons)
    failed = [line for line in lines if line["status"] == "failed"]
    assert failed and all(line["reason"].startswith("ValueError: boom on item ") for line in failed)
    dropped = [line for line in lines if line["status"] == "dropped"]
    assert dropped and all(line["trained_step"] is None for line in dropped)  # eta=1: groups were in flight
    n_rejected = stats["rejected"] + stats["filtered"]
    assert len([line for line in lines if line["status"] in ("rejected", "failed")]) == n_rejected


def _meta(version: int) -> Any:
    from areal_tasks.api.weight_update import WeightUpdateMeta

    return WeightUpdateMeta(type="disk", version=version, path="/nowhere")


def test_without_a_session_file_nothing_is_written(tmp_path: Path) -> None:
    executor = make(None, max_head_offpolicyness=0)
    with executor:
        executor.prepare_batch(timeout_s=T)
        executor.mark_trained(1)
    assert list(tmp_path.iterdir()) == []


def test_the_recorder_writes_each_episode_once_when_it_is_final(tmp_path: Path) -> None:
    path = tmp_path / "run" / "sessions.jsonl"
    rec = SessionRecorder(path, segment="s0")
    a = rec.open_episode(epoch=0, data_index=7, order=2, sample=0, group_seq=0, version=3)
    b = rec.open_episode(epoch=0, data_index=7, order=2, sample=1, group_seq=0, version=3)
    c = rec.open_episode(epoch=0, data_index=9, order=3, sample=0, group_seq=1, version=3)
    assert a is not None and b is not None and c is not None
    assert a.episode == "0.7.0.s0" and a.group == "0.7.s0.g0" and a.position == [0, 7]
    rec.ended(a, [{"out_tokens": 5}], 1.0)
    rec.ended(b, [{"out_tokens": 2}], 0.0)
    rec.settle(a, "accepted")
    rec.settle(b, "accepted")
    rec.settle(c, "rejected", "group filter: all rewards equal (0)")  # still running: not written yet
    rec.handed([(a, 1), (b, 0)], version=4)
    rec.trained(5)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["episode"], x["status"], x["trained_step"], x["staleness"]) for x in lines] == [
        ("0.7.0.s0", "accepted", 5, 1),
        ("0.7.1.s0", "accepted", 5, 0),
    ]
    assert lines[0]["n_output_tokens"] == 5 and lines[0]["handed_version"] == 4
    rec.ended(c, [], None)  # now it is final
    rec.settle(c, "dropped", "ignored: the outcome was known")
    d = rec.open_episode(epoch=1, data_index=0, order=0, sample=0, group_seq=2, version=5)
    rec.close("stopped for the test")
    rec.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [(x["episode"], x["status"], x["reason"]) for x in lines[2:]] == [
        ("0.9.0.s0", "rejected", "group filter: all rewards equal (0)"),
        ("1.0.0.s0", "dropped", "stopped for the test"),
    ]
    assert d is not None and lines[-1]["end_t"] >= lines[-1]["admitted_t"]
    assert rec.open_episode(epoch=2, data_index=0, order=0, sample=0, group_seq=3, version=5) is None  # closed


def test_close_drops_a_batch_handed_out_but_never_marked_trained(tmp_path: Path) -> None:
    rec = SessionRecorder(tmp_path / "s.jsonl", segment="x")
    a = rec.open_episode(epoch=0, data_index=0, order=0, sample=0, group_seq=0, version=0)
    rec.ended(a, [], 1.0)
    rec.settle(a, "accepted")
    rec.handed([(a, 0)], version=0)
    rec.close()
    (line,) = load_sessions(tmp_path / "s.jsonl")
    assert line["status"] == "dropped" and line["trained_step"] is None
    assert line["reason"].startswith("handed to the trainer, not marked trained")


def test_a_partial_last_line_is_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    path.write_text('{"episode": "old", "status": "accepted"}\n{"episode": "half-writ')
    rec = SessionRecorder(path, segment="r1")
    a = rec.open_episode(epoch=0, data_index=1, order=0, sample=0, group_seq=0, version=0)
    rec.ended(a, [], None)
    rec.settle(a, "failed", "ValueError: boom")
    rec.flush()
    assert [s["episode"] for s in load_sessions(path)] == ["old", "0.1.0.r1"]


def test_a_disabled_recorder_records_nothing(tmp_path: Path) -> None:
    rec = SessionRecorder(None)
    assert not rec.enabled
    assert rec.open_episode(epoch=0, data_index=0, order=0, sample=0, group_seq=0, version=0) is None
    rec.trained(1)
    rec.close()


class AbortingEngine(TimedEngine):
    """Answers as a client whose request was aborted by a weight update and resubmitted once."""

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        response = await super().agenerate(req)
        response.output_versions = [3, 3, 4, 4]
        response.n_resubmits = 1
        response.stop_reason = "length"
        return response


class FailingEngine(TimedEngine):
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        raise ConnectionError("server gone")


def test_each_generate_call_is_recorded_with_its_versions_and_aborts() -> None:
    episode = EpisodeEngine(AbortingEngine(version=4), EpisodeId(0, 1, 0))

    async def two_turns() -> None:
        await episode.agenerate(ModelRequest([1, 2, 3], SamplingParams(max_new_tokens=4)))
        await episode.agenerate(ModelRequest([1, 2, 3, 7, 7, 7, 7, 9], SamplingParams(max_new_tokens=4)))

    asyncio.run(two_turns())
    assert [(c["in_tokens"], c["out_tokens"], c["version_start"], c["version_end"]) for c in episode.calls] == [
        (3, 4, 3, 4),
        (8, 4, 3, 4),
    ]
    assert all(c["aborted"] == 1 and c["stop_reason"] == "length" for c in episode.calls)
    assert episode.calls[0]["t1"] <= episode.calls[1]["t0"]

    failing = EpisodeEngine(FailingEngine(version=2), EpisodeId(0, 2, 0))
    with pytest.raises(ConnectionError):
        asyncio.run(failing.agenerate(ModelRequest([1], SamplingParams())))
    (call,) = failing.calls
    assert call["stop_reason"] == "error: ConnectionError" and call["version_start"] == call["version_end"] == 2


def test_a_call_aborted_across_a_weight_update_in_the_executor(tmp_path: Path) -> None:
    """A request held by a paused engine finishes after the update with mixed versions."""
    path = tmp_path / "sessions.jsonl"
    engine = TimedEngine(delay=lambda rng: 0.2)
    executor = make(path, engine, batch_size=2, max_concurrent_rollouts=2, max_head_offpolicyness=0)
    with executor:
        deadline = time.monotonic() + T
        while engine.in_flight < 2 and time.monotonic() < deadline:  # the episodes are generating
            time.sleep(0.001)
        time.sleep(0.005)
        executor.swap_weights(_meta(1), None, 0)  # mid-generation: tokens before and after the swap
        batch = executor.prepare_batch(timeout_s=T)
        executor.mark_trained(1)
    lines = {(tuple(s["position"]), s["sample"]): s for s in load_sessions(path) if s["status"] == "accepted"}
    for traj in batch:
        epoch, index, sample = traj.metadata["episode"]["id"]
        (call,) = lines[((epoch, index), sample)]["calls"]
        assert (call["version_start"], call["version_end"]) == (traj.versions[-4], traj.versions[-1])
    assert any(c["version_start"] == 0 and c["version_end"] == 1 for s in lines.values() for c in s["calls"])


def test_reward_timing_and_notes_reach_only_the_bound_session() -> None:
    rec = SessionRecorder(None)
    assert current_session() is None
    note_rejection("nobody listens")  # outside an episode: a no-op

    async def reward(x: float) -> float:
        return x * 2

    assert asyncio.run(timed_reward(reward)(1.5)) == 3.0

    from areal_tasks.trace.sessions import EpisodeSession

    session = EpisodeSession("e", "g", [0, 0], 0, 0.0, 0)

    async def episode() -> None:
        bind(session)
        note_rejection("prompt too long")
        await timed_reward(reward)(1.0)
        await timed_reward(reward)(2.0)

    asyncio.run(episode())
    assert session.note == "prompt too long" and session.reward == 4.0
    assert session.reward_t0 is not None and session.reward_t1 is not None and session.reward_t0 <= session.reward_t1
    assert current_session() is None and rec.enabled is False


def test_an_executor_that_fails_drops_what_was_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "sessions.jsonl"
    engine = TimedEngine(delay=long_tail_delay(), seed=2)
    executor = make(path, engine, FakeWorkflow(fail=lambda item, n: True), max_failure_rate=0.0, failure_window=4)
    with executor, pytest.raises(RolloutError, match="episodes failed"):
        executor.prepare_batch(timeout_s=T)
    lines = load_sessions(path)
    assert len(lines) == executor.stats()["admitted"]
    statuses = {line["status"] for line in lines}
    assert "failed" in statuses and statuses <= {"failed", "rejected", "dropped"}
    dropped = [line["reason"] for line in lines if line["status"] == "dropped"]
    assert all(r.startswith(("the rollout executor failed: ", "still running")) for r in dropped)


def test_trace_sessions_switch_decides_where_the_session_trace_goes(tmp_path: Path) -> None:
    """``trace.sessions`` (on by default) is the one switch: off, the executor gets no session file."""
    from areal_tasks.config import load_config
    from areal_tasks.rollout.side import sessions_file

    on = load_config("configs/base.yaml", [f"experiment.run_dir={tmp_path}"])
    off = load_config("configs/base.yaml", [f"experiment.run_dir={tmp_path}", "trace.sessions=false"])
    assert sessions_file(on) == tmp_path / "sessions.jsonl"
    assert sessions_file(off) is None
