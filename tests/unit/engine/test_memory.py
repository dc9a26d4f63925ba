"""The memory estimator on CPU: hand-computed numbers for a tiny config, parameter counts of real
architectures, monotonicity, and the token cap for a budget."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.errors import ConfigError, EngineError
from areal_tasks.models.dims import ModelDims
from areal_tasks.models.memory import (
    GIB,
    device_memory_budget,
    dtype_bytes,
    estimate_memory,
    max_tokens_for_budget,
    resolve_max_tokens_per_mb,
)

# h=8, L=2, a=2 heads, g=1 kv head, d=4, I=16, V=32, untied, no biases.
TINY = {
    "model_type": "llama",
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "vocab_size": 32,
    "tie_word_embeddings": False,
}
# per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192, MLP 3*8*16 = 384, norms 2*8 = 16  -> 592
# root: embedding 32*8 + lm_head 32*8 + final norm 8 = 520; total 2*592 + 520 = 1704
TINY_PARAMS = 1704

QWEN2_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


def test_tiny_config_static_bytes_by_hand() -> None:
    est = estimate_memory(TINY, param_dtype="bf16", optimizer="adamw", fsdp_shard=False)
    assert est.num_params == est.num_trainable_params == TINY_PARAMS
    assert est.param_bytes == 2 * TINY_PARAMS
    assert est.grad_bytes == 2 * TINY_PARAMS
    assert est.optimizer_bytes == 12 * TINY_PARAMS  # fp32 master + two fp32 moments
    assert estimate_memory(TINY, param_dtype="fp32").optimizer_bytes == 8 * TINY_PARAMS  # params are the master
    assert estimate_memory(TINY, param_dtype="bf16", optimizer="adamw_pure").optimizer_bytes == 4 * TINY_PARAMS
    assert estimate_memory(TINY, param_dtype="bf16", optimizer="none").optimizer_bytes == 0


def test_tiny_config_activation_bytes_by_hand() -> None:
    est = estimate_memory(TINY, param_dtype="bf16")
    # norm 8*(4+2) = 48; attention 2*8 + 2*4*(2+2*1) + 2*2*2*4 + 4*2 = 88; MLP 2*8 + 4*2*16 = 144
    # layer 2*48 + 88 + 144 = 328; head 48 + 2*8 = 64; CE 4*32 kept + 8*32 transient = 384
    assert est.logits_bytes_per_token == 384
    assert est.activation_bytes_per_token_no_ckpt == 2 * 328 + 64 + 384
    assert est.activation_bytes_per_token_ckpt == 2 * 2 * 8 + 64 + max(384, 328)
    assert est.fixed_overhead_bytes == 0
    assert est.late_transient_bytes == 4 * TINY_PARAMS  # one fp32 moment-sized temporary in the step
    static = 16 * TINY_PARAMS
    assert est.total_bytes(100) == static + 100 * 1104


def test_tiny_config_sharded_and_tensor_parallel_by_hand() -> None:
    est = estimate_memory(TINY, param_dtype="bf16", dp=2)
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (TINY_PARAMS, TINY_PARAMS, 6 * TINY_PARAMS)
    # gathered root + two layers in bf16, one layer's gradient in bf16 + fp32
    assert est.fixed_overhead_bytes == (520 + 2 * 592) * 2 + 592 * 6
    assert est.late_transient_bytes == max(2 * TINY_PARAMS, 520 * 6)
    tp = estimate_memory(TINY, param_dtype="bf16", tp=2, fsdp_shard=False)
    assert tp.param_bytes == TINY_PARAMS and tp.activation_bytes_per_token_no_ckpt == 1104 // 2


def test_sharded_model_as_one_fsdp_unit_by_hand() -> None:
    """``fsdp_wrap="root"``: every parameter gathered in bf16 through forward and backward; at the end
    of backward every gradient unsharded in bf16 plus its fp32 reduce copy."""
    est = estimate_memory(TINY, param_dtype="bf16", dp=2, fsdp_wrap="root")
    assert (est.param_bytes, est.grad_bytes, est.optimizer_bytes) == (TINY_PARAMS, TINY_PARAMS, 6 * TINY_PARAMS)
    assert est.fixed_overhead_bytes == 2 * TINY_PARAMS
    assert est.late_transient_bytes == 6 * TINY_PARAMS
    # a 7B model as one unit holds all 7B parameters gathered: far more than two blocks and the root
    one_unit = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8, fsdp_wrap="root")
    per_block = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8)
    assert one_unit.fixed_overhead_bytes == 2 * one_unit.num_params > 3 * per_block.fixed_overhead_bytes
    assert one_unit.late_transient_bytes == 6 * one_unit.num_params
    with pytest.raises(ConfigError, match="fsdp_wrap must be block, root or none"):
        estimate_memory(TINY, param_dtype="bf16", dp=2, fsdp_wrap="auto")


def test_fsdp_wrap_resolves_by_shard_group_size() -> None:
    from areal_tasks.engine.fsdp.build import resolve_fsdp_wrap

    assert [resolve_fsdp_wrap("auto", n) for n in (1, 2, 8)] == ["root", "block", "block"]
    # one GPU without tp, LoRA or offload: no FSDP at all (flat buffers)
    assert resolve_fsdp_wrap("auto", 1, flat_capable=True) == "none"
    assert resolve_fsdp_wrap("auto", 2, flat_capable=True, unsharded_bytes=1, device_bytes=10**9) == "root"
    assert resolve_fsdp_wrap("root", 1, flat_capable=True) == "root"
    # several ranks: one unit when the model gathered is small for the GPU, per block otherwise
    h200 = 141 * 2**30
    assert resolve_fsdp_wrap("auto", 2, unsharded_bytes=494_000_000 * 8, device_bytes=h200) == "root"
    assert resolve_fsdp_wrap("auto", 2, unsharded_bytes=7_600_000_000 * 8, device_bytes=h200) == "block"
    assert resolve_fsdp_wrap("auto", 2, unsharded_bytes=494_000_000 * 8, device_bytes=None) == "block"
    assert resolve_fsdp_wrap("block", 2, unsharded_bytes=1, device_bytes=h200) == "block"
    assert resolve_fsdp_wrap("root", 4) == "root" and resolve_fsdp_wrap("block", 1) == "block"
    with pytest.raises(EngineError, match="fsdp_wrap must be auto, block, root or none, got 'blocks'"):
        resolve_fsdp_wrap("blocks", 2)


def test_gpu_memory_is_read_for_a_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` wrapping reads the GPU's memory (a NameError here once broke every GPU run)."""
    from types import SimpleNamespace

    from areal_tasks.engine.fsdp.build import gpu_memory_bytes

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=141 << 30))
    assert gpu_memory_bytes(torch.device("cuda", 0)) == 141 << 30
    assert gpu_memory_bytes(torch.device("cpu")) is None


def test_lora_counts_only_adapters_as_trainable() -> None:
    est = estimate_memory(TINY, param_dtype="bf16", lora_rank=2)
    # r * (in + out) over q, k, v, o, gate, up, down: 2 * (16 + 12 + 12 + 16 + 24 + 24 + 24) = 256 per layer
    assert est.num_trainable_params == 512
    assert est.num_params == TINY_PARAMS + 512
    assert est.grad_bytes == 2 * 512 and est.optimizer_bytes == 12 * 512


def test_qwen2_biases_and_qwen3_qk_norms_are_counted() -> None:
    qwen2 = ModelDims.from_config(dict(TINY, model_type="qwen2"))
    assert qwen2.num_params == TINY_PARAMS + 2 * (2 + 2 * 1) * 4
    qwen3 = ModelDims.from_config(dict(TINY, model_type="qwen3"))
    assert qwen3.num_params == TINY_PARAMS + 2 * 2 * 4


SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
}


# Parameter counts of these configs' transformers models (5.24, built on the meta device).
@pytest.mark.parametrize(
    ("config", "real"),
    [
        (dict(SMALL, model_type="qwen2"), 100416),
        (dict(SMALL, model_type="qwen2", tie_word_embeddings=True), 81216),
        (dict(SMALL, model_type="llama"), 100160),
        (dict(SMALL, model_type="qwen3", head_dim=32), 124864),
        (
            dict(
                SMALL,
                model_type="qwen2_moe",
                moe_intermediate_size=32,
                shared_expert_intermediate_size=48,
                num_experts=4,
                num_experts_per_tok=2,
            ),
            131776,
        ),
        (
            dict(
                SMALL,
                model_type="qwen3_moe",
                moe_intermediate_size=32,
                num_experts=4,
                num_experts_per_tok=2,
                head_dim=16,
            ),
            113024,
        ),
        (dict(SMALL, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2), 211264),
    ],
    ids=["qwen2", "qwen2-tied", "llama", "qwen3", "qwen2-moe", "qwen3-moe", "mixtral"],
)
def test_parameter_count_matches_transformers(config: dict, real: int) -> None:
    assert ModelDims.from_config(config).num_params == real


def test_qwen2_7b_is_7_6_billion_parameters_and_reads_nested_text_config() -> None:
    dims = ModelDims.from_config({"text_config": QWEN2_7B})
    assert dims.num_params == 7_615_616_512


def test_monotonic_in_tokens_parallelism_and_checkpointing() -> None:
    base = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8)
    assert base.total_bytes(1024) < base.total_bytes(2048) < base.total_bytes(4096)
    assert base.activation_bytes_per_token_ckpt < base.activation_bytes_per_token_no_ckpt
    statics = [estimate_memory(QWEN2_7B, param_dtype="bf16", dp=dp).static_bytes for dp in (1, 2, 4, 8)]
    assert statics == sorted(statics, reverse=True) and len(set(statics)) == 4
    per_token = [estimate_memory(QWEN2_7B, param_dtype="bf16", tp=tp).bytes_per_token for tp in (1, 2, 4)]
    assert per_token == sorted(per_token, reverse=True) and len(set(per_token)) == 3
    chunked = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8, ce_chunk_tokens=1024)
    assert chunked.bytes_per_token < base.bytes_per_token and chunked.logits_bytes_per_token == 0
    assert chunked.fixed_overhead_bytes > base.fixed_overhead_bytes
    bigger_vocab = estimate_memory(dict(QWEN2_7B, vocab_size=256000), param_dtype="bf16", dp=8)
    assert bigger_vocab.bytes_per_token > base.bytes_per_token


def test_the_logits_term_dominates_small_models_with_a_150k_vocabulary() -> None:
    small = dict(
        QWEN2_7B,
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
    )
    est = estimate_memory(small, param_dtype="bf16", gradient_checkpointing=True)
    assert est.logits_bytes_per_token > 0.9 * est.bytes_per_token


@pytest.mark.parametrize("checkpointing", [False, True])
def test_max_tokens_for_budget_is_the_largest_fitting_multiple(checkpointing: bool) -> None:
    est = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8, gradient_checkpointing=checkpointing)
    budget = 60 * GIB
    tokens = max_tokens_for_budget(est, budget)
    assert tokens % 128 == 0 and tokens > 0
    assert est.total_bytes(tokens) <= budget < est.total_bytes(tokens + 128)
    assert max_tokens_for_budget(est, 80 * GIB) > tokens
    assert max_tokens_for_budget(est, budget, multiple=1) >= tokens


def test_a_shared_weight_update_buffer_is_one_compute_dtype_copy_of_the_weights() -> None:
    """With shared weight updates every GPU rank keeps the published weights once more, in the
    compute dtype, whatever the sharding: the budget leaves that much less for activations."""
    plain = estimate_memory(QWEN2_7B, param_dtype="fp32", compute_dtype="bf16", dp=8)
    shared = estimate_memory(QWEN2_7B, param_dtype="fp32", compute_dtype="bf16", dp=8, publish_buffer=True)
    assert shared.publish_buffer_bytes == ModelDims.from_config(QWEN2_7B).num_params * 2
    assert shared.static_bytes == plain.static_bytes + shared.publish_buffer_bytes
    assert plain.publish_buffer_bytes == 0
    room = 60 * GIB
    assert max_tokens_for_budget(shared, room) < max_tokens_for_budget(plain, room)
    with pytest.raises(EngineError, match=r"shared weight-update buffer 14\.\d\d"):
        max_tokens_for_budget(estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8, publish_buffer=True), 17 * GIB)


def test_checkpointing_buys_more_tokens() -> None:
    plain = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8)
    ckpt = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8, gradient_checkpointing=True)
    assert max_tokens_for_budget(ckpt, 60 * GIB) > 2 * max_tokens_for_budget(plain, 60 * GIB)


def test_budget_too_small_raises_with_the_breakdown() -> None:
    est = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=1)
    with pytest.raises(EngineError, match=r"static .* GiB.*gradient checkpointing"):
        max_tokens_for_budget(est, 20 * GIB)


def test_resolve_max_tokens_per_mb_from_the_spec() -> None:
    est = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8)
    fitted = max_tokens_for_budget(est, 60 * GIB)
    assert resolve_max_tokens_per_mb(MicroBatchSpec(), est) is None
    assert resolve_max_tokens_per_mb(MicroBatchSpec(max_tokens_per_mb=4096), est) == 4096
    assert resolve_max_tokens_per_mb(MicroBatchSpec(memory_budget_gb=60), est) == fitted
    assert resolve_max_tokens_per_mb(MicroBatchSpec(max_tokens_per_mb=10**6, memory_budget_gb=60), est) == fitted
    assert resolve_max_tokens_per_mb(MicroBatchSpec(max_tokens_per_mb=1024, memory_budget_gb=60), est) == 1024


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_device_budget_without_cuda_says_to_set_memory_budget_gb() -> None:
    with pytest.raises(EngineError, match="memory_budget_gb"):
        device_memory_budget()


def test_inputs_are_validated() -> None:
    assert dtype_bytes(torch.bfloat16) == 2 and dtype_bytes("float32") == 4
    with pytest.raises(ConfigError, match="unknown dtype"):
        dtype_bytes("int4")
    with pytest.raises(ConfigError, match="optimizer"):
        estimate_memory(TINY, optimizer="lion")
    with pytest.raises(ConfigError, match="dp must be"):
        estimate_memory(TINY, dp=0)
    with pytest.raises(ConfigError, match=r"lacks \['vocab_size'\]"):
        estimate_memory({k: v for k, v in TINY.items() if k != "vocab_size"})


def test_the_engine_sizes_micro_batches_with_room_for_its_shared_weight_buffer() -> None:
    from types import SimpleNamespace

    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.fsdp.engine import _micro_batch_spec
    from areal_tasks.engine.parallel.mesh import ParallelDims

    config = EngineConfig(micro_batch=MicroBatchSpec(memory_budget_gb=60))
    built = SimpleNamespace(hf_config=QWEN2_7B, param_dtype_name="bfloat16", fsdp_wrap="block", lm_head=None)
    dims = ParallelDims(dp=8)
    plain = _micro_batch_spec(config, built, dims).max_tokens_per_mb
    shared = _micro_batch_spec(config, built, dims, shared_weight_buffer=True).max_tokens_per_mb
    assert 0 < shared < plain


def test_kept_logits_cost_one_compute_dtype_row_of_the_vocabulary_a_token() -> None:
    """``ce_keep_logits``: the chunked head keeps every token's logits (``c V`` bytes) until the
    backward, with and without checkpointing (the head's backward runs before any recomputed layer
    needs room), and the engine's budgeted micro-batches shrink by that much."""
    from types import SimpleNamespace

    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.fsdp.engine import _micro_batch_spec
    from areal_tasks.engine.parallel.mesh import ParallelDims

    for ckpt in (False, True):
        plain = estimate_memory(QWEN2_7B, param_dtype="bf16", dp=8, ce_chunk_tokens=1024, gradient_checkpointing=ckpt)
        kept = estimate_memory(
            QWEN2_7B, param_dtype="bf16", dp=8, ce_chunk_tokens=1024, gradient_checkpointing=ckpt, ce_keep_logits=True
        )
        assert kept.logits_bytes_per_token == 2 * QWEN2_7B["vocab_size"]
        assert kept.activation_bytes_per_token_no_ckpt == plain.activation_bytes_per_token_no_ckpt + 2 * 152064
        assert kept.bytes_per_token > plain.bytes_per_token
    with pytest.raises(ConfigError, match="ce_keep_logits needs the chunked cross-entropy"):
        estimate_memory(QWEN2_7B, param_dtype="bf16", ce_keep_logits=True)
    config = EngineConfig(micro_batch=MicroBatchSpec(memory_budget_gb=60))
    head = SimpleNamespace(chunk=1024, keep_logits=False)
    built = SimpleNamespace(hf_config=QWEN2_7B, param_dtype_name="bfloat16", fsdp_wrap="block", lm_head=head)
    recomputing = _micro_batch_spec(config, built, ParallelDims(dp=8)).max_tokens_per_mb
    head.keep_logits = True
    assert 0 < _micro_batch_spec(config, built, ParallelDims(dp=8)).max_tokens_per_mb < recomputing


def test_without_fsdp_the_compute_dtype_gradients_are_a_persistent_buffer() -> None:
    """``fsdp_wrap="none"``: the engine's flat bf16 gradient buffer lives all step, on top of the
    one-rank layout's compute copy of the weights; sharded layouts cannot be ``none``."""
    root = estimate_memory(QWEN2_7B, param_dtype="fp32", compute_dtype="bf16", fsdp_wrap="root")
    none = estimate_memory(QWEN2_7B, param_dtype="fp32", compute_dtype="bf16", fsdp_wrap="none")
    assert none.fixed_overhead_bytes == root.fixed_overhead_bytes + ModelDims.from_config(QWEN2_7B).num_params * 2
    with pytest.raises(ConfigError, match="fsdp_wrap must be block, root or none"):
        estimate_memory(QWEN2_7B, fsdp_wrap="flat")
