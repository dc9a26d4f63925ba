"""The layout recommendation plans with the engine's own memory estimate (one estimator), and the
facts the two share stay equal to the engine's."""

from __future__ import annotations

import pytest

from areal_tasks.models import memory as mem
from areal_tasks.models import memory_archon, model_info_from_config, recommend_layout
from areal_tasks.models.dims import ModelDims
from areal_tasks.models.families import FAMILIES, traits

QWEN2_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
}
QWEN3_MOE = {
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


@pytest.mark.parametrize(("n_train", "tp"), [(1, 1), (2, 2), (4, 1), (4, 2), (8, 4)])
def test_the_fsdp_plan_is_the_engines_estimate(n_train: int, tp: int) -> None:
    dims = ModelDims.from_config(QWEN2_7B)
    dp = n_train // tp
    wrap = "block" if dp > 1 else ("none" if tp == 1 else "root")
    chunk = mem.planning_chunk_tokens(dims.vocab_size, 16384)
    engine = mem.estimate_memory(
        dims, param_dtype="bfloat16", dp=dp, tp=tp, fsdp_wrap=wrap, gradient_checkpointing=True, ce_chunk_tokens=chunk
    )
    planned = mem.fsdp_train_bytes(dims, dp=dp, tp=tp, dtype="bfloat16", tokens_per_gpu=16384)
    assert planned == engine.total_bytes(16384)
    full_ce = mem.fsdp_train_bytes(dims, dp=dp, tp=tp, dtype="bfloat16", tokens_per_gpu=16384, chunked_ce=False)
    assert full_ce > planned


@pytest.mark.parametrize(("n_gpus", "gpu_memory_gb"), [(2, 80.0), (8, 80.0), (8, 24.0), (64, 24.0)])
def test_the_recommendation_reports_the_estimate_of_the_layout_it_chose(n_gpus: int, gpu_memory_gb: float) -> None:
    info = model_info_from_config(QWEN2_7B)
    rec = recommend_layout(info, n_gpus, gpu_memory_gb)
    planned = mem.fsdp_train_bytes(info.dims, dp=rec.train_dp, tp=rec.train_tp, dtype="bfloat16", tokens_per_gpu=16384)
    assert rec.train_gib_per_gpu == round(planned / mem.GIB, 2)
    assert rec.fits == (planned <= gpu_memory_gb * 1e9 * mem.USABLE_FRACTION)


def test_a_vision_tower_is_sharded_training_state() -> None:
    dims = ModelDims.from_config(QWEN2_7B)
    plain = mem.fsdp_train_bytes(dims, dp=4, tp=1, dtype="bfloat16", tokens_per_gpu=1024)
    with_tower = mem.fsdp_train_bytes(dims, dp=4, tp=1, dtype="bfloat16", tokens_per_gpu=1024, extra_params=400)
    assert with_tower - plain == 400 * mem.TRAIN_STATE_BYTES // 4


def test_archon_states_by_hand() -> None:
    """Replaces the Megatron check (megatron is not built; MoE plans with archon). fp32 params, grads
    and moments over every data-parallel rank of the stage; experts gathered 1/ep of them a layer."""
    dims = ModelDims.from_config(QWEN3_MOE)
    experts = dims.routed_expert_params
    assert experts == 48 * 128 * 3 * 2048 * 768
    layer_experts = 128 * 3 * 2048 * 768
    for dp, pp, cp, ep in [(8, 1, 1, 8), (4, 2, 1, 4), (2, 1, 4, 8)]:
        local = dims.num_params / (pp * dp * cp)
        moe_layer = dims.layer_params(True) - layer_experts + layer_experts / ep
        root = dims.root_params if pp == 1 else dims.vocab_size * 2048 + 2048
        fixed = (root + 2 * moe_layer) * 2 + moe_layer * 6
        static, late = memory_archon.archon_static_bytes(dims, dp=dp, pp=pp, cp=cp, ep=ep, dtype="bfloat16")
        assert static == int(local * 16 + fixed)
        assert late == int(local * 16 + max(local * 4, root * 6))  # the AdamW step's temporary moment
        per_token = memory_archon.archon_bytes_per_token(dims, dtype="bfloat16", pp=pp, cp=cp)
        total = memory_archon.archon_train_bytes(dims, dp=dp, pp=pp, cp=cp, ep=ep, dtype="bfloat16", tokens_per_gpu=64)
        assert total == max(static + 64 * per_token, late)
    # activations: every layer kept (no recomputation), Ulysses splits them; more experts per rank never less memory
    assert memory_archon.archon_bytes_per_token(
        dims, dtype="bfloat16", cp=4
    ) * 4 >= memory_archon.archon_bytes_per_token(dims, dtype="bfloat16")
    e8 = memory_archon.archon_train_bytes(dims, dp=8, ep=8, dtype="bfloat16", tokens_per_gpu=1024)
    e1 = memory_archon.archon_train_bytes(dims, dp=8, ep=1, dtype="bfloat16", tokens_per_gpu=1024)
    assert e8 < e1


def test_archon_ep_must_divide_the_data_parallel_ranks() -> None:
    from areal_tasks.errors import ConfigError

    with pytest.raises(ConfigError, match="ep=8"):
        memory_archon.archon_static_bytes(ModelDims.from_config(QWEN3_MOE), dp=4, ep=8, dtype="bfloat16")


def test_inference_weights_are_bf16_over_tp() -> None:
    assert mem.inference_weight_bytes(1000, 1) == 2000
    assert mem.inference_weight_bytes(1001, 2) == 1001


def test_the_chunked_head_facts_equal_the_engines() -> None:
    """The layout plans the chunked cross-entropy for the families whose head the engine chunks,
    with the engine's chunk size."""
    from areal_tasks.kernels import lm_head

    assert mem.CE_CHUNK_ELEMENTS == lm_head.CHUNK_ELEMENTS
    assert {family for family in FAMILIES if traits(family).plain_lm_head} == set(lm_head.PLAIN_HEAD_FAMILIES)
    for vocab in (32, 32000, 151936, 256000):
        assert mem.planning_chunk_tokens(vocab) == lm_head.default_chunk_size(vocab)
    assert mem.planning_chunk_tokens(32, 100) == 100  # a micro-batch smaller than a chunk is one chunk
