"""Episode identity and the deterministic rollout mode (``rollout.sampling.seed_mode: per_sample``).

Seeds are a function of the episode's identity and turn only; every trajectory carries its
identity; with a seed base the executor seeds every request from it and returns batches in data
order, so two executors whose requests finish in different orders give the same batches.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

from areal_tasks.api.inference import ModelRequest, ModelResponse, SamplingParams
from areal_tasks.config.rollout import RolloutConfig
from areal_tasks.rollout.episodes import EpisodeEngine, EpisodeId, append_episode_log, episode_seed
from areal_tasks.rollout.executor import RolloutExecutor
from tests.unit.rollout.fakes import FakeWorkflow, TimedEngine, long_tail_delay

T = 30.0


class SeedRecorder(TimedEngine):
    """A TimedEngine that records the seed of every request and answers as server ``srv-<n>``."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.seeds: list[int | None] = []

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        self.seeds.append(req.sampling.seed)
        response = await super().agenerate(req)
        response.server = "srv-1"
        response.n_resubmits = 1
        return response


def test_seeds_differ_per_identity_and_turn_and_fit_63_bits() -> None:
    ids = [EpisodeId(e, i, j) for e in range(2) for i in range(5) for j in range(4)]
    seeds = {episode_seed(7, ep, turn) for ep in ids for turn in range(3)}
    assert len(seeds) == len(ids) * 3
    assert all(0 <= s < 2**63 for s in seeds)
    assert episode_seed(7, EpisodeId(0, 1, 2), 0) == episode_seed(7, EpisodeId(0, 1, 2), 0)
    assert episode_seed(8, EpisodeId(0, 1, 2), 0) != episode_seed(7, EpisodeId(0, 1, 2), 0)


def test_episode_engine_seeds_each_turn_and_records_servers() -> None:
    inner = SeedRecorder()
    episode = EpisodeEngine(inner, EpisodeId(0, 3, 1), seed_base=11)

    async def two_turns() -> None:
        for _ in range(2):
            await episode.agenerate(ModelRequest([1, 2], SamplingParams(max_new_tokens=2, seed=5)))

    asyncio.run(two_turns())
    assert inner.seeds == [episode_seed(11, EpisodeId(0, 3, 1), 0), episode_seed(11, EpisodeId(0, 3, 1), 1)]
    assert episode.record() == {"id": [0, 3, 1], "servers": ["srv-1", "srv-1"], "resubmits": 2}
    assert episode.get_version() == inner.get_version()  # everything else is the shared engine's

    plain = SeedRecorder()
    asyncio.run(EpisodeEngine(plain, EpisodeId(0, 0, 0)).agenerate(ModelRequest([1], SamplingParams(seed=5))))
    assert plain.seeds == [5]  # no base: the workflow's seed is left alone


def _batches(delay_seed: int, *, per_sample: bool, n: int = 4) -> tuple[list[list[Any]], SeedRecorder]:
    engine = SeedRecorder(delay=long_tail_delay(), seed=delay_seed)
    executor = RolloutExecutor(
        engine=engine,
        workflow=FakeWorkflow(),
        dataset=list(range(40)),
        batch_size=8,
        group_size=2,
        max_concurrent_rollouts=16,
        max_head_offpolicyness=0,
        max_failure_rate=0.5,
        seed=3,
        seed_base=99 if per_sample else None,
    )
    out = []
    with executor:
        for _ in range(n):
            batch = executor.prepare_batch(timeout_s=T)
            out.append([t.metadata["episode"]["id"] for t in batch])
            engine.set_version(engine.version + 1)
            executor.set_version(engine.version)
    return out, engine


def test_per_sample_mode_seeds_by_identity_and_orders_batches_by_data() -> None:
    first, engine = _batches(1, per_sample=True)
    second, _ = _batches(2, per_sample=True)  # other delays: other completion orders
    assert first == second
    order = [(e, i) for batch in first for e, i, _ in batch[::2]]
    random_order = list(range(40))
    random.Random(3 * 1_000_003).shuffle(random_order)  # the data source's epoch-0 order for seed 3
    assert order == [(0, i) for i in random_order[: len(order)]]
    for batch in first:
        assert [j for _, _, j in batch] == [0, 1] * 4
    expected = {episode_seed(99, EpisodeId(*ep), 0) for batch in first for ep in batch}
    assert expected <= set(engine.seeds) and None not in engine.seeds  # (and the next, unconsumed groups)


def test_shared_mode_stamps_ids_and_leaves_seeds_alone() -> None:
    batches, engine = _batches(1, per_sample=False, n=2)
    assert all(len(batch) == 8 and all(len(ep) == 3 for ep in batch) for batch in batches)
    assert set(engine.seeds) == {None}


def test_from_config_takes_the_seed_base_from_the_sampling_seed_else_the_experiment_seed() -> None:
    def base(**sampling: Any) -> int | None:
        cfg = RolloutConfig()
        for key, value in sampling.items():
            setattr(cfg.sampling, key, value)
        ex = RolloutExecutor.from_config(
            cfg, engine=TimedEngine(), workflow=FakeWorkflow(), dataset=[1, 2], batch_size=cfg.group_size, seed=5
        )
        return ex._groups.seed_base

    assert base() is None
    assert base(seed_mode="per_sample") == 5
    assert base(seed_mode="per_sample", seed=17) == 17


def test_episode_log_has_one_line_per_step(tmp_path: Path) -> None:
    from areal_tasks.api.workflow import Trajectory

    traj = Trajectory([1, 2], [0, 1], [0.0, -0.1], [-1, 0], 1.0, 1, {"episode": {"id": [0, 4, 1], "servers": ["a"]}})
    path = tmp_path / "episodes.jsonl"
    append_episode_log(path, 3, [traj])
    append_episode_log(path, 4, [traj])
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == [3, 4]
    assert lines[0] == {"step": 3, "episodes": [[0, 4, 1]], "servers": [["a"]], "resubmits": [0]}
