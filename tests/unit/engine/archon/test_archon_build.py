"""build_decoder: actor and critic from HF directories, dtype and device, and its refusals."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.model import build_decoder
from areal_tasks.engine.archon.model.hf_io import archon_to_hf
from areal_tasks.errors import EngineError, ModelError
from areal_tasks.models.safetensors_dir import write_safetensors_shards


@pytest.mark.parametrize("family", ["qwen3", "qwen2_moe"])
def test_critic_values_match_the_fsdp_critic(family, tiny_model_factory, packed):
    from areal_tasks.models.critic import load_critic

    model_dir = tiny_model_factory(family)
    model, args = build_decoder(model_dir, role="critic")
    assert model.lm_head is None and model.value_head is not None
    batch = packed()
    out = model(batch.input_ids, position_ids=batch.position_ids, cu_seqlens=batch.cu_seqlens, bounds=batch.bounds)
    values = out[0] if args.is_moe else out
    assert values.shape == (1, batch.input_ids.shape[1], 1) and values.dtype == torch.float32

    hf = load_critic(str(model_dir), dtype=torch.float32, attn_implementation="eager").eval()
    torch.testing.assert_close(model.value_head.weight, hf.score.weight, atol=0, rtol=0)
    expected = torch.cat([hf(input_ids=seq[None]).logits[0] for seq in batch.sequences()])
    torch.testing.assert_close(values[0], expected, atol=1e-5, rtol=1e-5)


def test_critic_checkpoint_round_trip(tiny_model_factory, tmp_path):
    """A saved critic (with score.*) builds back with the same head, and refuses to build as an actor."""
    import shutil

    model_dir = tiny_model_factory("llama")
    model, args = build_decoder(model_dir, role="critic")
    with torch.no_grad():
        model.value_head.weight.add_(1.0)
        model.value_head.bias.fill_(0.5)
    saved = tmp_path / "critic"
    saved.mkdir()
    for name in ("config.json",):
        shutil.copy(model_dir / name, saved / name)
    state = dict(kv for name, t in model.state_dict().items() for kv in archon_to_hf(name, t, args))
    write_safetensors_shards(state, saved)
    again, _ = build_decoder(saved, role="critic")
    torch.testing.assert_close(again.value_head.weight, model.value_head.weight, atol=0, rtol=0)
    assert float(again.value_head.bias.detach()) == 0.5
    with pytest.raises(ModelError, match="critic checkpoint"):
        build_decoder(saved, role="actor")


def test_dtype_and_missing_weights(tiny_model_factory, tmp_path):
    import shutil

    from areal_tasks.models.safetensors_dir import read_safetensors_dir

    model_dir = tiny_model_factory("qwen2")
    model, _ = build_decoder(model_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(p.is_meta for p in model.parameters())

    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(model_dir / "config.json", broken / "config.json")
    state = read_safetensors_dir(model_dir)
    del state["model.layers.1.self_attn.q_proj.bias"]
    write_safetensors_shards(state, broken)
    with pytest.raises(ModelError, match="q_proj.bias"):
        build_decoder(broken)


def test_unsupported_model_type_is_an_engine_error(tiny_model_factory):
    with pytest.raises(EngineError, match="does not support model_type 'gemma'"):
        build_decoder(tiny_model_factory("gemma"))
    with pytest.raises(EngineError, match="unknown model role"):
        build_decoder(tiny_model_factory("llama"), role="reward")
