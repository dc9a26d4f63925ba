"""The session trace of a real run: a few asynchronous RL steps on a tiny random model (one embedded
server, one gloo train rank, the rollout side in its own process as on GPUs), DAPO's group filter
dropping the groups whose rewards are all equal (a coin reward on the completion's bytes, so both
kinds of group occur).

``<run_dir>/sessions.jsonl`` must then hold one line per admitted episode, each in the schema, with:
every trained sample of each step (``rollout/n_samples`` of ``rl_metrics.jsonl``) an ``accepted``
line of that step, the same episodes as ``rollout_episodes.jsonl`` lists for the step, a staleness
matching the step's ``rollout/staleness_*`` metrics, and a reason on every line not trained.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.trace.queries import load_sessions, rejection_reasons, staleness_histogram
from areal_tasks.trainer.rl import run_train

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REWARD_MODULE = "sessions_trace_reward"
REWARD_SOURCE = textwrap.dedent(
    '''
    """A coin for a random model: 1.0 when the completion's UTF-8 bytes sum to an even number."""


    def byte_parity(completion: str, answer: str, **kwargs: object) -> float:
        return 1.0 if sum(completion.encode("utf-8")) % 2 == 0 else 0.0
    '''
)
STEPS = 3
BATCH = 4


def test_every_trained_sample_has_a_session_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the reward module is imported by the job's processes (RL worker, rollout process, reward
    # workers), which inherit PYTHONPATH
    (tmp_path / f"{REWARD_MODULE}.py").write_text(REWARD_SOURCE, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.syspath_prepend(str(tmp_path))  # and the controller, which checks it before starting
    run_dir = tmp_path / "run"
    cfg = load_config(
        "configs/demo_grpo.yaml",
        [
            f"experiment.run_dir={run_dir}",
            "allocation=embedded:d1+fsdp:d1",
            "dataset.path=demo:arithmetic?n_train=64&n_eval=2",
            "evaluation.max_eval_prompts=2",
            "evaluation.n_samples=1",
            f"train.total_steps={STEPS}",
            "train.sft_warmup_steps=0",
            f"train.batch_size={BATCH}",
            "rollout.group_size=2",
            "rollout.max_concurrent_rollouts=8",
            "rollout.max_head_offpolicyness=1",
            "rollout.own_process=on",
            "rollout.sampling.max_new_tokens=6",
            "rollout.reward.workers=1",
            f"rollout.reward.fn={REWARD_MODULE}:byte_parity",
            "algorithm.name=dapo",
            "actor.micro_batch.granularity=2",
        ],
    )
    summary = run_train(cfg)
    rows = [json.loads(line) for line in (run_dir / "rl_metrics.jsonl").read_text().splitlines()]
    logged = [json.loads(line) for line in (run_dir / "rollout_episodes.jsonl").read_text().splitlines()]
    sessions = load_sessions(run_dir)

    assert len(rows) == STEPS and len({s["episode"] for s in sessions}) == len(sessions)
    assert len(sessions) == summary["executor"]["admitted"]
    assert {s["status"] for s in sessions} <= {"accepted", "rejected", "failed", "dropped"}
    for row, episodes in zip(rows, logged, strict=True):
        step = row["step"]
        trained = [s for s in sessions if s["trained_step"] == step]
        assert all(s["status"] == "accepted" for s in trained)
        assert len(trained) == row["rollout/n_samples"] == BATCH
        assert sorted([*s["position"], s["sample"]] for s in trained) == sorted(episodes["episodes"])
        staleness = [s["staleness"] for s in trained]
        assert max(staleness) == row["rollout/staleness_max"]
        assert sum(staleness) / len(staleness) == pytest.approx(row["rollout/staleness_mean"])
        for s in trained:
            assert s["calls"] and s["n_output_tokens"] == sum(c["out_tokens"] for c in s["calls"])
            assert s["reward"] in (0.0, 1.0) and s["reward_t0"] <= s["reward_t1"] <= s["end_t"]
            assert s["admitted_version"] <= s["calls"][0]["version_start"] <= s["calls"][-1]["version_end"]
    assert sum(staleness_histogram(sessions).values()) == STEPS * BATCH
    for s in sessions:
        if s["status"] != "accepted":
            assert s["reason"] and s["trained_step"] is None
    reasons = rejection_reasons(sessions)
    assert all(r.startswith(("group filter: all rewards equal", "group rejected: ", "empty output")) for r in reasons)
    assert summary["executor"]["filtered"] == 0 or any(r.startswith("group filter") for r in reasons)
