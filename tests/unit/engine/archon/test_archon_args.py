"""ArchonArgs from transformers configs: supported families, refused ones, rope types, MoE layer
placement and the parameter counts the pipeline splitter reads."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.archon.model import ArchonArgs, ArchonDecoder, build_decoder
from areal_tasks.engine.archon.model.args import SUPPORTED_MODEL_TYPES
from areal_tasks.engine.archon.model.layers import rope_inv_freq
from areal_tasks.errors import EngineError

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral")


def _config(model_type: str, **kwargs):
    from transformers import AutoConfig

    shape = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}
    shape["intermediate_size"] = 96
    return AutoConfig.for_model(model_type, **{**shape, "vocab_size": 128, **kwargs})


def test_unsupported_model_type_names_the_supported_ones():
    with pytest.raises(EngineError, match="gemma2") as info:
        ArchonArgs.from_hf({"model_type": "gemma2", "hidden_size": 8})
    for name in SUPPORTED_MODEL_TYPES:
        assert name in str(info.value)
    with pytest.raises(EngineError, match="None"):
        ArchonArgs.from_hf({})


def test_unsupported_rope_and_activation_are_refused():
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32}
    with pytest.raises(EngineError, match="rope_type 'yarn'"):
        ArchonArgs.from_hf(_config("llama", rope_parameters=rope))
    with pytest.raises(EngineError, match="hidden_act"):
        ArchonArgs.from_hf(_config("llama", hidden_act="gelu"))
    with pytest.raises(EngineError, match="router_jitter_noise"):
        ArchonArgs.from_hf(_config("mixtral", router_jitter_noise=0.1))


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 5000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_rope_frequencies_match_transformers(rope):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _config("llama", rope_parameters=rope, max_position_embeddings=1024)
    args = ArchonArgs.from_hf(config)
    assert args.rope_type == rope["rope_type"]
    expected = LlamaRotaryEmbedding(config).inv_freq
    torch.testing.assert_close(rope_inv_freq(args), expected, atol=0, rtol=1e-6)


def test_dict_config_is_completed_with_defaults(tiny_model_factory):
    import json

    model_dir = tiny_model_factory("qwen2_moe")
    raw = json.loads((model_dir / "config.json").read_text())
    from transformers import AutoConfig

    assert ArchonArgs.from_hf(raw) == ArchonArgs.from_hf(AutoConfig.from_pretrained(str(model_dir)))


@pytest.mark.parametrize("family", FAMILIES)
def test_param_counts_match_transformers(family, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_factory(family)
    model, args = build_decoder(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    total = (
        args.embed_param_count + args.head_param_count + sum(args.layer_param_count(i) for i in range(args.n_layers))
    )
    assert total == sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in model.parameters())
    for i in range(args.n_layers):
        assert args.layer_param_count(i) == sum(p.numel() for p in model.layers[str(i)].parameters())
        assert args.layer_flops_per_token(i) > 0
    if args.is_moe:
        assert args.layer_flops_per_token(0) < 2 * args.layer_param_count(0)  # active experts only


def test_moe_layer_placement_follows_transformers():
    from transformers import AutoModelForCausalLM

    config = _config(
        "qwen2_moe",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
    )
    args = ArchonArgs.from_hf(config)
    hf = AutoModelForCausalLM.from_config(config)
    model = ArchonDecoder(args)
    for i in range(args.n_layers):
        hf_moe = hasattr(hf.model.layers[i].mlp, "experts")
        assert args.is_moe_layer(i) == hf_moe == hasattr(model.layers[str(i)].mlp, "experts")
    assert [args.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    assert args.n_moe_layers == 1


def test_sliding_window_per_family():
    assert ArchonArgs.from_hf(_config("mistral", sliding_window=16)).layer_sliding_window(0) == 16
    assert ArchonArgs.from_hf(_config("mistral", sliding_window=None)).sliding_window is None
    assert ArchonArgs.from_hf(_config("qwen2")).sliding_window is None  # use_sliding_window off
    args = ArchonArgs.from_hf(_config("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2))
    assert [args.layer_sliding_window(i) for i in range(4)] == [None, None, 8, 8]
    assert ArchonArgs.from_hf(_config("qwen2_moe", num_experts=4)).sliding_window is None
    model = ArchonDecoder(args)
    assert model.layers["3"].self_attn.sliding_window == 8 and model.layers["0"].self_attn.sliding_window is None


def test_sliding_window_matches_transformers(packed):
    """A window shorter than the sequences: mistral's log-probs still equal transformers'."""
    from transformers import AutoModelForCausalLM

    from areal_tasks.engine.archon.model.hf_io import hf_to_archon
    from areal_tasks.kernels.logprobs import next_token_stats

    config = _config("mistral", sliding_window=3, num_hidden_layers=2)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    args = ArchonArgs.from_hf(config)
    model = ArchonDecoder(args)
    model.load_state_dict(hf_to_archon(hf.state_dict(), args))
    batch = packed(vocab=128)
    out = model(batch.input_ids, position_ids=batch.position_ids, cu_seqlens=batch.cu_seqlens, labels=batch.labels)
    rows = []
    for seq in batch.sequences():
        logits = hf(input_ids=seq[None]).logits[0, :-1]
        rows.append(torch.stack(next_token_stats(logits, seq[1:], with_entropy=True), -1))
    torch.testing.assert_close(out[0, batch.scored()], torch.cat(rows), atol=1e-5, rtol=1e-5)
