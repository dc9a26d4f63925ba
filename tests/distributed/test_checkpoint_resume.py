"""Kill-and-resume is exact on 2 gloo ranks: N steps straight equal N/2 steps, a SIGKILL in the middle
of the next save, a restart with recover.mode=auto and the remaining steps -- weights, optimizer
state, LR schedule and metrics bit-identical. The killed save's directory is ignored by the restart
and replaced when that step is saved again."""

from __future__ import annotations

import pytest
import torch

from launch import WorkerError, run_workers

pytestmark = pytest.mark.distributed

STEPS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_qwen2):
    out = tmp_path_factory.mktemp("resume")
    common = {"model_dir": str(tiny_qwen2), "steps": STEPS, "save_every": 2}
    straight = {**common, "url": f"file://{out}/straight", "tag": "straight"}
    killed_run = {**common, "url": f"file://{out}/killed", "tag": "killed", "kill_at": STEPS}
    with pytest.raises(WorkerError) as killed:  # the straight run, then one that dies in its second save
        run_workers("workers_checkpoint:sequence", 2, out, {"calls": [["train_run", straight], ["train_run", killed_run]]})
    ckpts = out / "killed/exp/trial/checkpoints"
    partial = {p.relative_to(ckpts).as_posix() for p in (ckpts / f"step_{STEPS}").rglob("*") if p.is_file()}
    run_workers("workers_checkpoint:train_run", 2, out, {**common, "url": f"file://{out}/killed", "tag": "resumed"})
    return {
        "straight": torch.load(out / "straight.pt", weights_only=False),
        "resumed": torch.load(out / "resumed.pt", weights_only=False),
        "kill_message": str(killed.value),
        "partial": partial,
    }


def test_the_kill_left_a_partial_checkpoint(runs):
    assert "exited with -9" in runs["kill_message"]
    assert f"step_{STEPS}/dcp/rank-00000.distcp" in runs["partial"]
    assert f"step_{STEPS}/_COMPLETE" not in runs["partial"] and f"step_{STEPS}/metadata.json" not in runs["partial"]


def test_resume_starts_from_the_last_complete_checkpoint(runs):
    resumed = runs["resumed"]
    assert resumed["resumed_from"] == STEPS // 2
    assert resumed["trainer_state"]["dataloader"] == {"next": [17, STEPS // 2 + 1]}
    assert sorted(resumed["metrics"]) == list(range(STEPS // 2 + 1, STEPS + 1))
    assert resumed["listing"] == [(STEPS // 2, "complete"), (STEPS, "complete")]


def test_weights_optimizer_lr_and_metrics_are_bit_identical(runs):
    straight, resumed = runs["straight"], runs["resumed"]
    for step, stats in resumed["metrics"].items():
        assert stats == straight["metrics"][step], f"step {step} metrics differ"
    assert resumed["last_lr"] == straight["last_lr"] and resumed["version"] == straight["version"] == STEPS
    for name, tensor in straight["params"].items():
        assert torch.equal(tensor, resumed["params"][name]), f"{name} differs after resuming"
    s_state, r_state = straight["optim"]["state"], resumed["optim"]["state"]
    assert s_state.keys() == r_state.keys() and s_state
    for name, entry in s_state.items():
        for key, value in entry.items():
            assert torch.equal(value, r_state[name][key]), f"optimizer {key} of {name} differs"
    assert straight["optim"]["param_groups"] == resumed["optim"]["param_groups"]
