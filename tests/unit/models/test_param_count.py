"""The config-only parameter count equals transformers' own module tree, exactly.

Models are instantiated on the meta device (no memory, no init), for every supported family,
with shapes that exercise biases, GQA, explicit head_dim, tied/untied embeddings, dense layers
inside MoE models, shared experts and vision towers. Configs go through ``to_json_string`` so the
count sees what ``save_pretrained`` writes (with and without default-valued keys).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

from areal_tasks.models import model_info_from_config
from areal_tasks.models.dims import ModelDims
from areal_tasks.models.families import TEXT_DEFAULTS, TEXT_MODEL_TYPE

TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}
MLA = {
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "n_group": 1,
    "topk_group": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
}
CAUSAL_CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama", {}),
    ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    ("qwen2", {}),
    ("qwen3", {"head_dim": 24}),
    ("mistral", {}),
    ("gemma", {}),
    ("gemma2", {}),
    ("gemma3_text", {"attention_bias": True}),
    (
        "qwen2_moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [2],
        },
    ),
    ("qwen3_moe", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [0]}),
    ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ("deepseek_v3", MLA),
    ("deepseek_v2", {**MLA, "q_lora_rank": None}),
]
VISION_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "qwen2_vl",
        {
            "text_config": TEXT,
            "vision_config": {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 4, "mlp_ratio": 2},
        },
    ),
    (
        "qwen2_5_vl",
        {
            "text_config": TEXT,
            "vision_config": {
                "depth": 2,
                "hidden_size": 32,
                "out_hidden_size": 64,
                "num_heads": 4,
                "intermediate_size": 48,
            },
        },
    ),
    (
        "llava",
        {
            "text_config": {"model_type": "qwen2", **TEXT},
            "vision_feature_layer": [-2, -1],
            "vision_config": {
                "model_type": "clip_vision_model",
                "hidden_size": 32,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": 32,
                "patch_size": 8,
            },
        },
    ),
    (
        "gemma3",
        {
            "text_config": TEXT,
            "vision_config": {
                "hidden_size": 32,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "image_size": 32,
                "patch_size": 8,
            },
        },
    ),
]


def _numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _saved_forms(config: Any) -> list[dict[str, Any]]:
    return [json.loads(config.to_json_string(use_diff=use_diff)) for use_diff in (False, True)]


@pytest.mark.parametrize(
    ("model_type", "overrides"), CAUSAL_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CAUSAL_CASES)]
)
def test_text_count_is_exact(model_type: str, overrides: dict[str, Any]) -> None:
    config = AutoConfig.for_model(model_type, **{**TEXT, **overrides})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    expected = _numel(model)
    experts = [p for name, p in model.named_parameters() if ".experts." in name]
    dims = ModelDims.from_config(config)  # the engine's path: a transformers config object
    assert dims.num_params == expected
    assert dims.routed_expert_params == sum(p.numel() for p in experts)
    for saved in _saved_forms(config):
        assert ModelDims.from_config(saved) == dims
        info = model_info_from_config(saved)
        assert info.num_parameters == expected
        if experts:  # routed experts are fused tensors with the expert index first
            num_experts = experts[0].shape[0]
            inactive = sum(p.numel() for p in experts) * (num_experts - info.dims.experts_per_token) // num_experts
            assert info.is_moe and info.num_active_parameters == expected - inactive
        else:
            assert not info.is_moe and info.num_active_parameters == expected


@pytest.mark.parametrize(("model_type", "kwargs"), VISION_CASES, ids=[m for m, _ in VISION_CASES])
def test_vision_language_count_is_exact(model_type: str, kwargs: dict[str, Any]) -> None:
    config = AutoConfig.for_model(model_type, **kwargs)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    for saved in _saved_forms(config):
        info = model_info_from_config(saved)
        assert info.is_vision_language and info.num_vision_parameters > 0 and not info.warnings
        assert info.num_parameters == _numel(model)


@pytest.mark.parametrize("family", sorted(TEXT_DEFAULTS))
def test_defaults_table_matches_transformers(family: str) -> None:
    """Keys omitted from a saved config.json fall back to the same defaults transformers uses."""
    config = AutoConfig.for_model(TEXT_MODEL_TYPE[family])
    for key, default in TEXT_DEFAULTS[family].items():
        actual = getattr(config, key, None)
        if key == "head_dim" and default is None:
            assert actual in (None, config.hidden_size // config.num_attention_heads), key
        elif key in ("attention_bias", "mlp_bias") and actual is None:
            assert default is False, key  # the family has no such switch: the counter's traits decide
        else:
            assert actual == default, key
