"""Checkpoints of the FSDP engine on 2 gloo ranks, in two launches (process start-up dominates).

Kill-and-resume is exact: N steps straight equal N/2 steps, a SIGKILL in the middle of the next
save, a restart with recover.mode=auto and the remaining steps -- weights, optimizer state, LR
schedule and metrics bit-identical; the killed save's directory is ignored by the restart and
replaced when that step is saved again.

Incremental and async saves of a LoRA engine: after the first save only the adapters (and their
optimizer state) are written, the frozen base is referenced; async saves hold the weights of the
moment they were called while training went on; retention keeps the last and the best and never
deletes referenced data; a fresh engine loads the latest exactly; the HF export of a checkpoint
equals the engine's own HF save (weights and logits in plain transformers).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from launch import WorkerError, run_workers

pytestmark = pytest.mark.distributed

STEPS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_qwen2):
    out = tmp_path_factory.mktemp("ckpt")
    common = {"model_dir": str(tiny_qwen2), "steps": STEPS, "save_every": 2}
    straight = {**common, "url": f"file://{out}/straight", "tag": "straight"}
    lora = {"model_dir": str(tiny_qwen2), "url": f"file://{out}/lora"}
    killed_run = {**common, "url": f"file://{out}/killed", "tag": "killed", "kill_at": STEPS}
    calls = [["train_run", straight], ["lora_run", lora], ["train_run", killed_run]]
    with pytest.raises(WorkerError) as killed:  # the last run dies in its second save
        run_workers("workers_checkpoint:sequence", 2, out, {"calls": calls})
    ckpts = out / "killed/exp/trial/checkpoints"
    partial = {p.relative_to(ckpts).as_posix() for p in (ckpts / f"step_{STEPS}").rglob("*") if p.is_file()}
    shutil.copytree(out / "killed", out / "killed_copy")  # what a reader and a prune see after the kill
    run_workers("workers_checkpoint:train_run", 2, out, {**common, "url": f"file://{out}/killed", "tag": "resumed"})
    return {
        "out": out,
        "straight": torch.load(out / "straight.pt", weights_only=False),
        "resumed": torch.load(out / "resumed.pt", weights_only=False),
        "lora": torch.load(out / "lora.pt", weights_only=False),
        "kill_message": str(killed.value),
        "partial": partial,
    }


def test_the_kill_left_a_partial_checkpoint(runs):
    assert "exited with -9" in runs["kill_message"]
    assert f"step_{STEPS}/dcp/rank-00000.distcp" in runs["partial"]
    assert f"step_{STEPS}/_COMPLETE" not in runs["partial"] and f"step_{STEPS}/metadata.json" not in runs["partial"]


def test_readers_ignore_the_killed_save_and_prune_removes_it(runs):
    from areal_tasks.checkpoint.manager import CheckpointManager
    from areal_tasks.errors import CheckpointError

    reader = CheckpointManager.open(f"file://{runs['out']}/killed_copy/exp/trial/checkpoints")
    assert reader.latest() == STEPS // 2
    assert [(i.step, i.status) for i in reader.list()] == [(STEPS // 2, "complete"), (STEPS, "partial")]
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        reader.metadata(STEPS)
    assert reader.prune().delete == [f"step_{STEPS}"]
    assert [(i.step, i.status) for i in reader.list()] == [(STEPS // 2, "complete")]


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


def _split_bytes(params: dict[str, torch.Tensor]) -> tuple[int, int]:
    lora = sum(t.numel() * t.element_size() for n, t in params.items() if ".lora_" in n)
    base = sum(t.numel() * t.element_size() for n, t in params.items() if ".lora_" not in n)
    return lora, base


def test_second_checkpoint_writes_only_adapter_bytes(runs):
    res = runs["lora"]
    lora_bytes, base_bytes = _split_bytes(res["at_save"][1])
    first, second = res["metas"][0], res["metas"][1]
    data = {m["step"]: sum(f["size"] for n, f in m["files"].items() if n.startswith("dcp/rank-")) for m in res["metas"]}
    print(
        f"\nLoRA checkpoint data bytes: full {data[1]}, incremental {data[2]} "
        f"(adapters {lora_bytes} B x3 with AdamW moments, frozen base {base_bytes} B referenced)"
    )
    assert first["sizes"]["referenced"] == 0 and data[1] >= base_bytes + 3 * lora_bytes
    assert second["parent"] == 1 and second["sizes"]["referenced"] >= base_bytes
    assert 3 * lora_bytes <= data[2] < 3 * lora_bytes + 16 * 1024  # adapters + moments + small objects
    assert "step_1" in second["references"]


def test_async_saves_hold_the_state_at_save_time_and_load_exactly(runs):
    res = runs["lora"]
    for step in (1, 3):
        for name, tensor in res["at_save"][step].items():
            assert torch.equal(res["reread"][step][name], tensor), f"step {step}: {name}"
    assert any(not torch.equal(res["at_save"][1][n], res["at_save"][3][n]) for n in res["at_save"][1])
    assert res["loaded_step"] == 3
    for name, tensor in res["at_save"][3].items():
        assert torch.equal(res["loaded"][name], tensor), name


def test_retention_keeps_last_and_best_and_referenced_data(runs):
    res = runs["lora"]
    assert res["listing"] == [(1, "complete"), (3, "complete")]  # best score (1) and last (3); 2 pruned
    assert not any(name.startswith("step_2/") for name in res["files"])
    for meta in res["metas"][2:]:
        for directory, files in meta["references"].items():
            for name in files:
                assert f"{directory}/{name}" in res["files"], f"referenced {directory}/{name} was deleted"


def test_export_equals_the_engine_hf_save(runs):
    from transformers import AutoModelForCausalLM

    out = runs["out"]
    exported = AutoModelForCausalLM.from_pretrained(str(out / "export_hf"), dtype=torch.float32)
    engine_hf = AutoModelForCausalLM.from_pretrained(str(out / "engine_hf"), dtype=torch.float32)
    expected = engine_hf.state_dict()
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    ids = torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, engine_hf(input_ids=ids).logits)
