"""The layout recommendation plans with the engine's own memory estimate (one estimator), and the
facts the two share stay equal to the engine's."""

from __future__ import annotations

import pytest

from areal_tasks.models import memory as mem
from areal_tasks.models import model_info_from_config, recommend_layout
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


def test_megatron_states_by_hand() -> None:
    """Routed experts over EP, the rest over TP; bf16 params + fp32 grads, 1/dp of fp32 master and moments."""
    dims = ModelDims.from_config(QWEN3_MOE)
    experts = dims.routed_expert_params
    assert experts == 48 * 128 * 3 * 2048 * 768
    for dp, tp, ep in [(8, 1, 8), (4, 2, 4)]:
        local = (dims.num_params - experts) / tp + experts / ep
        states = int(local * 6 + local * 12 / dp)
        activations = mem.estimate_memory(
            dims,
            param_dtype="bfloat16",
            tp=tp,
            fsdp_shard=False,
            gradient_checkpointing=True,
            ce_chunk_tokens=mem.planning_chunk_tokens(dims.vocab_size, 4096),
        )
        assert mem.megatron_train_bytes(dims, dp=dp, tp=tp, ep=ep, dtype="bfloat16", tokens_per_gpu=4096) == (
            states + activations.fixed_overhead_bytes + 4096 * activations.activation_bytes_per_token_ckpt
        )


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
