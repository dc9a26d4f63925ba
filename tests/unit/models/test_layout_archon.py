"""Every MoE layout the recommendation gives is one the archon engine runs: it parses, the engine
registry maps it to the engine's dims, and the engine's own layout checker finds no problem.

Checked for the tiny kit's MoE families and real-size shapes (Qwen3-30B-A3B, Mixtral-8x7B,
Qwen1.5-MoE-A2.7B, and a tied-embedding variant) on 8, 16 and 64 GPUs.
"""

from __future__ import annotations

from typing import Any

import pytest

from areal_tasks.config.allocation import parse_allocation
from areal_tasks.engine.archon.layout import MOE_FAMILIES, layout_problems
from areal_tasks.engine.registry import engine_dims, flat_dims
from areal_tasks.models import memory_archon, model_info_from_config, recommend_layout
from areal_tasks.models.layout import ARCHON_MOE_FAMILIES
from areal_tasks.models.memory import USABLE_FRACTION
from areal_tasks.models.tiny.kit import tiny_config

QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
}
QWEN1_5_MOE_A2_7B = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "vocab_size": 151936,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "mixtral-8x7b": MIXTRAL_8X7B,
    "qwen1.5-moe-a2.7b": QWEN1_5_MOE_A2_7B,
    "qwen3-30b-a3b-tied": {**QWEN3_30B_A3B, "tie_word_embeddings": True},
    **{f"tiny-{family}": {"model_type": family, **tiny_config(family)} for family in MOE_FAMILIES},
}


def test_the_planned_families_are_the_engines() -> None:
    assert set(ARCHON_MOE_FAMILIES) == set(MOE_FAMILIES)


@pytest.mark.parametrize("n_gpus", [8, 16, 64])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_recommended_moe_layout_runs_on_archon(name: str, n_gpus: int) -> None:
    config = CONFIGS[name]
    rec = recommend_layout(model_info_from_config(config), n_gpus)
    assert rec.train_backend == "archon"
    mode = parse_allocation(rec.allocation, total_gpus=n_gpus)
    (train,) = [component for component in mode.components if component.kind == "training"]
    dims = engine_dims(train.backend, flat_dims(train))
    assert (dims.dp, dims.tp, dims.pp, dims.sp, dims.ep) == (
        rec.train_dp,
        rec.train_tp,
        rec.train_pp,
        rec.train_cp,
        rec.train_ep,
    )
    assert dims.tp == 1 and rec.train_ep > 1
    assert layout_problems(config, tp=dims.tp, pp=dims.pp, cp=dims.sp, ep=dims.ep) == []
    assert any("archon:" in reason for reason in rec.reasons)


def test_pipeline_stages_when_data_and_experts_do_not_fit() -> None:
    """A deep model with a large vocabulary: d x e holds every layer's activations and the
    cross-entropy on one rank, two stages put the cross-entropy on the second only."""
    config = {**tiny_config("qwen3_moe"), "model_type": "qwen3_moe", "num_hidden_layers": 4, "vocab_size": 262144}
    info = model_info_from_config(config)
    assert recommend_layout(info, 8, tokens_per_gpu=16384).allocation == "sglang:d4+archon:d4e4"
    d4e4 = memory_archon.archon_train_bytes(info.dims, dp=4, ep=4, dtype="bfloat16", tokens_per_gpu=16384)
    d2p2e2 = memory_archon.archon_train_bytes(info.dims, dp=2, pp=2, ep=2, dtype="bfloat16", tokens_per_gpu=16384)
    assert d2p2e2 < d4e4
    gpu_gb = (d2p2e2 + d4e4) / 2 / USABLE_FRACTION / 1e9  # room for two stages, not for d x e
    rec = recommend_layout(info, 8, gpu_memory_gb=gpu_gb, tokens_per_gpu=16384)
    assert (rec.train_pp, rec.fits) == (2, True), rec.reasons
    assert rec.allocation.endswith("+archon:d2p2e2")
    assert layout_problems(config, pp=2, ep=2) == []
    assert any("p=2 pipeline stages" in reason for reason in rec.reasons)


def test_other_moe_families_train_on_fsdp() -> None:
    deepseek = {
        "model_type": "deepseek_v3",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "vocab_size": 1024,
    }
    rec = recommend_layout(model_info_from_config(deepseek), 8)
    assert rec.allocation == "sglang:d4+fsdp:d4"
    assert any("does not define 'deepseek_v3'" in reason for reason in rec.reasons)
