"""The HF <-> archon name map: exact round trips of the tiny checkpoints (per-expert on-disk names),
tied embeddings, the critic head, and the names the decoder's module tree has."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.model import ArchonArgs, ArchonDecoder, build_decoder
from areal_tasks.engine.archon.model.hf_io import archon_to_hf, hf_names, hf_to_archon
from areal_tasks.errors import ModelError
from areal_tasks.models.safetensors_dir import read_safetensors_dir

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral")


def _args(model_dir) -> ArchonArgs:
    from transformers import AutoConfig

    return ArchonArgs.from_hf(AutoConfig.from_pretrained(str(model_dir)))


def _export(state: dict[str, torch.Tensor], args: ArchonArgs) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        for hf_name, t in archon_to_hf(name, tensor, args):
            assert hf_name not in out, hf_name
            out[hf_name] = t
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_exact(family, tiny_model_factory):
    model_dir = tiny_model_factory(family)
    args = _args(model_dir)
    disk = read_safetensors_dir(model_dir)
    assert set(hf_names(args)) == set(disk)
    assert len(hf_names(args)) == len(disk)

    state = hf_to_archon(disk, args)
    model = ArchonDecoder(args)
    assert set(state) == set(model.state_dict())  # every archon tensor comes from the checkpoint
    for name, tensor in model.state_dict().items():
        assert state[name].shape == tensor.shape, name

    back = _export(state, args)
    assert set(back) == set(disk)
    for name, tensor in disk.items():
        assert torch.equal(back[name], tensor), name

    # a built model exports the checkpoint it was built from
    built, _ = build_decoder(model_dir)
    exported = _export(built.state_dict(), args)
    assert set(exported) == set(disk)
    for name, tensor in disk.items():
        assert torch.equal(exported[name], tensor), name


def test_experts_stack_and_unstack_with_an_offset(tiny_model_factory):
    model_dir = tiny_model_factory("mixtral")
    args = _args(model_dir)
    disk = read_safetensors_dir(model_dir)
    state = hf_to_archon(disk, args)
    w1 = state["layers.1.mlp.experts.gate_proj"]
    assert w1.shape == (args.n_experts, args.moe_intermediate_size, args.hidden_size)
    assert torch.equal(w1[2], disk["model.layers.1.block_sparse_moe.experts.2.w1.weight"])
    assert torch.equal(state["layers.1.mlp.gate.weight"], disk["model.layers.1.block_sparse_moe.gate.weight"])
    local = archon_to_hf(
        "layers.1.mlp.experts.down_proj", state["layers.1.mlp.experts.down_proj"][2:], args, expert_offset=2
    )
    assert [n for n, _ in local] == [f"model.layers.1.block_sparse_moe.experts.{e}.w2.weight" for e in (2, 3)]


def test_missing_expert_and_unknown_names_are_errors(tiny_model_factory):
    model_dir = tiny_model_factory("qwen3_moe")
    args = _args(model_dir)
    disk = read_safetensors_dir(model_dir)
    broken = {k: v for k, v in disk.items() if k != "model.layers.0.mlp.experts.3.up_proj.weight"}
    with pytest.raises(ModelError, match="experts"):
        hf_to_archon(broken, args)
    with pytest.raises(ModelError, match="no archon name"):
        hf_to_archon({**disk, "vision_tower.weight": torch.zeros(1)}, args)
    with pytest.raises(ModelError, match="no HF name"):
        archon_to_hf("rotary.inv_freq", torch.zeros(1), args)


def test_tied_embeddings(tiny_model_factory, packed, hf_causal_lm, hf_reference):
    model_dir = tiny_model_factory("qwen2", tie_word_embeddings=True)
    disk = read_safetensors_dir(model_dir)
    assert "lm_head.weight" not in disk
    model, args = build_decoder(model_dir)
    assert args.tie_word_embeddings
    assert model.lm_head is not None and model.embed_tokens is not None
    assert model.lm_head.weight is model.embed_tokens.weight
    assert set(_export(model.state_dict(), args)) == set(disk) == set(hf_names(args))
    batch = packed()
    out = model(
        batch.input_ids,
        position_ids=batch.position_ids,
        cu_seqlens=batch.cu_seqlens,
        bounds=batch.bounds,
        labels=batch.labels,
    )
    ref, _ = hf_reference(hf_causal_lm(model_dir), batch, 1.0)
    torch.testing.assert_close(out[0, batch.scored()], ref, atol=1e-5, rtol=1e-5)


def test_critic_names(tiny_model_factory):
    model_dir = tiny_model_factory("llama")
    model, args = build_decoder(model_dir, role="critic")
    exported = _export(model.state_dict(), args)
    assert set(exported) == set(hf_names(args, role="critic"))
    assert {"score.weight", "score.bias"} <= set(exported) and "lm_head.weight" not in exported
    assert set(hf_to_archon(exported, args)) == set(model.state_dict())
