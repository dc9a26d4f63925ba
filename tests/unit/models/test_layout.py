"""Layout recommendations for a 0.5B, a 7B and a 70B dense model and a 30B MoE, on several GPU counts
(the MoE families on archon in detail: ``test_layout_archon.py``).

Every recommended spec must also parse under the project's allocation grammar with the given GPUs.
"""

from __future__ import annotations

from typing import Any

import pytest

from areal_tasks.config.allocation import parse_allocation
from areal_tasks.errors import ModelError
from areal_tasks.models import ModelInfo, model_info_from_config, recommend_layout

QWEN2_0_5B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
QWEN2_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
}
LLAMA3_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}
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


def _info(config: dict[str, Any]) -> ModelInfo:
    return model_info_from_config(config)


def _check_consistent(rec: Any, n_gpus: int) -> None:
    mode = parse_allocation(rec.allocation, total_gpus=n_gpus)
    assert mode.total_gpus == rec.n_inference_gpus + rec.n_train_gpus <= n_gpus
    assert rec.inference_dp * rec.inference_tp == rec.n_inference_gpus
    assert rec.train_dp * rec.train_tp * rec.train_pp * rec.train_cp == rec.n_train_gpus
    assert rec.reasons


@pytest.mark.parametrize(
    ("n_gpus", "allocation"), [(2, "sglang:d1+fsdp:d1"), (8, "sglang:d4+fsdp:d4"), (5, "sglang:d2+fsdp:d3")]
)
def test_small_dense_is_pure_fsdp(n_gpus: int, allocation: str) -> None:
    rec = recommend_layout(_info(QWEN2_0_5B), n_gpus)
    assert (rec.train_backend, rec.allocation, rec.fits, rec.train_tp) == ("fsdp", allocation, True, 1)
    _check_consistent(rec, n_gpus)


def test_7b_fits_on_eight_but_not_two() -> None:
    rec = recommend_layout(_info(QWEN2_7B), 8)
    assert (rec.allocation, rec.fits) == ("sglang:d4+fsdp:d4", True)
    _check_consistent(rec, 8)
    small = recommend_layout(_info(QWEN2_7B), 2)
    assert not small.fits and any("does not fit" in r for r in small.reasons)


def test_70b_raises_tp_for_training_and_inference() -> None:
    rec = recommend_layout(_info(LLAMA3_70B), 64)
    assert rec.fits and rec.train_backend == "fsdp"
    assert rec.train_tp == 2 and rec.inference_tp == 4  # 141 GB of bf16 weights need 4-way TP to leave KV room
    assert rec.allocation == "sglang:d8t4+fsdp:d16t2"
    _check_consistent(rec, 64)


def test_70b_on_one_node_does_not_fit() -> None:
    rec = recommend_layout(_info(LLAMA3_70B), 8)
    assert not rec.fits and any("does not fit" in r for r in rec.reasons)
    _check_consistent(rec, 8)


def test_more_memory_per_gpu_needs_less_tp() -> None:
    assert recommend_layout(_info(LLAMA3_70B), 64, gpu_memory_gb=141.0).train_tp == 1


def test_moe_uses_archon_with_expert_parallel() -> None:
    """Was megatron:d8e8 on 16 GPUs (megatron is not built); archon runs MoE with e over d x c."""
    rec = recommend_layout(_info(QWEN3_30B_A3B), 64)
    assert (rec.train_backend, rec.fits, rec.train_ep, rec.train_tp) == ("archon", True, 32, 1)
    assert rec.allocation == "sglang:d16t2+archon:d8c4e32"
    assert (rec.train_dp * rec.train_cp) % rec.train_ep == 0 and 128 % rec.train_ep == 0
    assert any("Ulysses c=4" in reason for reason in rec.reasons)
    _check_consistent(rec, 64)


def test_moe_that_does_not_fit_says_which_micro_batch_would() -> None:
    """archon recomputes no activations: 16K-token micro-batches of a 30B MoE overflow 8 training
    GPUs, so the recommendation keeps d x e and names the micro-batch size that fits."""
    rec = recommend_layout(_info(QWEN3_30B_A3B), 16)
    assert (rec.allocation, rec.fits) == ("sglang:d4t2+archon:d8e8", False)
    assert "max_tokens_per_mb" in rec.reasons[-1]
    _check_consistent(rec, 16)


@pytest.mark.parametrize("n_gpus", [0, 1])
def test_cpu_layout_without_two_gpus(n_gpus: int) -> None:
    rec = recommend_layout(_info(QWEN2_0_5B), n_gpus)
    assert (rec.allocation, rec.device, rec.inference_backend) == ("embedded:d1+fsdp:d1", "cpu", "embedded")
    parse_allocation(rec.allocation)
    if n_gpus == 1:
        assert any("colocat" in r for r in rec.reasons)
    assert not recommend_layout(_info(QWEN2_7B), n_gpus).fits  # too big for CPU training


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_gpus": -1}, "n_gpus"),
        ({"n_gpus": 8, "gpu_memory_gb": 0}, "gpu_memory_gb"),
        ({"n_gpus": 8, "train_dtype": "int8"}, "train_dtype"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelError, match=match):
        recommend_layout(_info(QWEN2_0_5B), **kwargs)


def test_to_dict_is_json_ready() -> None:
    import json

    data = recommend_layout(_info(QWEN2_7B), 8).to_dict()
    assert json.loads(json.dumps(data))["allocation"] == "sglang:d4+fsdp:d4"
