"""DCP save then load continues bit-identically (model, optimizer, LR schedule, version); the HF
export (and the disk weight update) loads in plain transformers with the engine's exact weights
and log-probs, and loads back into an engine. Run on 2 gloo ranks with a tied-embedding model."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import ATOL, RTOL, make_batch, reference_logprobs
from launch import run_workers

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    from areal_tasks.models import build_tiny_model

    model_dir = build_tiny_model("qwen2", seed=0, tie_word_embeddings=True)
    out = tmp_path_factory.mktemp("ckpt")
    run_workers("workers_fsdp:checkpoint_roundtrip", 2, out, {"model_dir": str(model_dir)})
    return out, torch.load(out / "result.pt", weights_only=False)


def test_dcp_resume_is_bit_identical(result):
    _, res = result
    assert res["version"] == 2
    assert res["lrs"][0] == res["lrs"][1]
    for name, tensor in res["final_first"].items():
        assert torch.equal(tensor, res["final_resumed"][name]), f"{name} differs after resuming"
    changed = [n for n, t in res["final_first"].items() if not torch.equal(t, res["at_save"][n])]
    assert changed, "the steps after the checkpoint changed nothing: the comparison would be vacuous"


@pytest.mark.parametrize("subdir", ["hf", "disk_update"])
def test_hf_export_loads_in_plain_transformers(result, subdir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, res = result
    model = AutoModelForCausalLM.from_pretrained(str(out / subdir), dtype=torch.float32)
    state = model.state_dict()
    for name, tensor in res["at_save"].items():
        assert torch.equal(state[name], tensor), f"{name} differs in the export"
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(
            reference_logprobs(model, make_batch(seed=0)), res["forward"]["logprobs"], atol=ATOL, rtol=RTOL
        )
    assert AutoTokenizer.from_pretrained(str(out / subdir)) is not None
    assert not any(p.name.startswith(".") for p in out.iterdir()), "staging directories left behind"


def test_hf_export_loads_back_into_an_engine(result):
    _, res = result
    for name, tensor in res["at_save"].items():
        assert torch.equal(res["loaded_hf"][name], tensor), f"{name} differs after load(format='hf')"
