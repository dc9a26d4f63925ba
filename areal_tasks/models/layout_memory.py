"""Per-GPU memory estimates behind the layout recommendation (rules of thumb, stated in bytes).

Training, FSDP (fully sharded, mixed precision): fp32 sharded parameters, fp32 gradients and two
fp32 AdamW moments = 16 bytes per parameter, divided over every training GPU; plus the unsharded
working set (the layer being computed and the one being prefetched, in the compute dtype).

Training, Megatron (distributed optimizer): each GPU holds its parameter slice in the compute dtype
and fp32 gradients (2 + 4 bytes), and 1/dp of the fp32 master weights and moments (12 bytes). Dense
weights are sliced by TP; routed experts by EP.

Activations (activation checkpointing on): the checkpointed input of every layer, one layer's
recomputed intermediates and fp32 logits + log-softmax over the vocabulary, for
``tokens_per_gpu`` tokens, divided by TP (sequence parallel splits them too).

Inference: weights in bf16 (2 bytes per parameter) divided by TP must leave a share of the GPU for
the KV cache.
"""

from __future__ import annotations

from areal_tasks.models.info import ModelInfo

GIB = 1024**3
#: fraction of a GPU that allocations can use (the rest: CUDA context, allocator fragmentation)
USABLE_FRACTION = 0.9
#: at most this share of the usable memory may hold inference weights; the rest is KV cache
INFERENCE_WEIGHT_SHARE = 0.6
FSDP_STATE_BYTES = 16
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def routed_expert_parameters(info: ModelInfo) -> int:
    """Parameters in routed experts (all layers), recovered from total vs active counts."""
    if not info.is_moe or info.num_experts <= info.experts_per_token:
        return 0
    inactive = info.num_parameters - info.num_active_parameters
    return inactive * info.num_experts // (info.num_experts - info.experts_per_token)


def activation_bytes(info: ModelInfo, tokens_per_gpu: int, dtype_bytes: int, tp: int) -> float:
    """Activation memory of one training micro-batch on one GPU."""
    h, layers = info.hidden_size, info.num_layers
    checkpoints = tokens_per_gpu * h * layers * dtype_bytes
    one_layer = tokens_per_gpu * (10 * h + 3 * info.intermediate_size) * dtype_bytes
    logits = tokens_per_gpu * info.vocab_size * 4 * 2
    return (checkpoints + one_layer + logits) / tp


def fsdp_bytes_per_gpu(info: ModelInfo, n_train: int, tp: int, dtype_bytes: int, tokens_per_gpu: int) -> float:
    """FSDP (+ TP) training memory on one GPU."""
    states = info.num_parameters * FSDP_STATE_BYTES / n_train
    working_set = 2 * (info.num_parameters / max(info.num_layers, 1)) * dtype_bytes / tp
    return states + working_set + activation_bytes(info, tokens_per_gpu, dtype_bytes, tp)


def megatron_bytes_per_gpu(info: ModelInfo, dp: int, tp: int, ep: int, dtype_bytes: int, tokens_per_gpu: int) -> float:
    """Megatron training memory on one GPU (distributed optimizer; experts over EP, the rest over TP)."""
    experts = routed_expert_parameters(info)
    local = (info.num_parameters - experts) / tp + experts / ep
    optimizer_bytes = 12 if dtype_bytes == 2 else 8
    states = local * (dtype_bytes + 4) + local * optimizer_bytes / dp
    return states + activation_bytes(info, tokens_per_gpu, dtype_bytes, tp)


def inference_weight_bytes(info: ModelInfo, tp: int) -> float:
    """bf16 weights of one inference server rank."""
    return info.num_parameters * 2 / tp
