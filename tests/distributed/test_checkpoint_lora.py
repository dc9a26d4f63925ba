"""Incremental and async checkpoints of a LoRA engine on 2 gloo ranks: after the first save only the
adapters (and their optimizer state) are written, the frozen base is referenced; async saves hold the
weights of the moment they were called while training went on; retention keeps the last and the best
and never deletes referenced data; a fresh engine loads the latest exactly; the HF export of a
checkpoint equals the engine's own HF save (weights and logits in plain transformers)."""

from __future__ import annotations

import pytest
import torch

from launch import run_workers

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def result(tmp_path_factory, tiny_qwen2):
    out = tmp_path_factory.mktemp("lora")
    run_workers("workers_checkpoint:lora_run", 2, out, {"model_dir": str(tiny_qwen2), "url": f"file://{out}/store"})
    return out, torch.load(out / "lora.pt", weights_only=False)


def _split_bytes(params: dict[str, torch.Tensor]) -> tuple[int, int]:
    lora = sum(t.numel() * t.element_size() for n, t in params.items() if ".lora_" in n)
    base = sum(t.numel() * t.element_size() for n, t in params.items() if ".lora_" not in n)
    return lora, base


def test_second_checkpoint_writes_only_adapter_bytes(result):
    _, res = result
    lora_bytes, base_bytes = _split_bytes(res["at_save"][1])
    first, second = res["metas"][0], res["metas"][1]
    data = {m["step"]: sum(f["size"] for n, f in m["files"].items() if n.startswith("dcp/rank-")) for m in res["metas"]}
    print(f"\nLoRA checkpoint data bytes: full {data[1]}, incremental {data[2]} "
          f"(adapters {lora_bytes} B x3 with AdamW moments, frozen base {base_bytes} B referenced)")
    assert first["sizes"]["referenced"] == 0 and data[1] >= base_bytes + 3 * lora_bytes
    assert second["parent"] == 1 and second["sizes"]["referenced"] >= base_bytes
    assert 3 * lora_bytes <= data[2] < 3 * lora_bytes + 16 * 1024  # adapters + moments + small objects
    assert "step_1" in second["references"]


def test_async_saves_hold_the_state_at_save_time_and_load_exactly(result):
    _, res = result
    for step in (1, 3):
        for name, tensor in res["at_save"][step].items():
            assert torch.equal(res["reread"][step][name], tensor), f"step {step}: {name}"
    assert any(not torch.equal(res["at_save"][1][n], res["at_save"][3][n]) for n in res["at_save"][1])
    assert res["loaded_step"] == 3
    for name, tensor in res["at_save"][3].items():
        assert torch.equal(res["loaded"][name], tensor), name


def test_retention_keeps_last_and_best_and_referenced_data(result):
    _, res = result
    assert res["listing"] == [(1, "complete"), (3, "complete")]  # best score (1) and last (3); 2 pruned
    assert not any(name.startswith("step_2/") for name in res["files"])
    for meta in res["metas"][2:]:
        for directory, files in meta["references"].items():
            for name in files:
                assert f"{directory}/{name}" in res["files"], f"referenced {directory}/{name} was deleted"


def test_export_equals_the_engine_hf_save(result):
    from transformers import AutoModelForCausalLM

    out, _ = result
    exported = AutoModelForCausalLM.from_pretrained(str(out / "export_hf"), dtype=torch.float32)
    engine_hf = AutoModelForCausalLM.from_pretrained(str(out / "engine_hf"), dtype=torch.float32)
    expected = engine_hf.state_dict()
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    ids = torch.randint(0, 1024, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, engine_hf(input_ids=ids).logits)
