"""Memory estimate of one archon training GPU, for the layout recommendation.

The archon engine (``engine/archon/``) differs from what :mod:`areal_tasks.models.memory` plans
for FSDP in four ways this module models: it keeps fp32 parameters and gradients (FSDP2 casts to
the compute dtype for the forward and reduces in fp32); routed experts are split over ``ep`` ranks
and then FSDP-sharded over the ``dp * cp / ep`` ranks that hold the same slice; pipeline stages
(``pp``) each hold ``1/pp`` of the layers, the first the embedding and the last the head; and it
neither recomputes activations nor chunks the cross-entropy. The per-layer activation terms are
the shared ones (:func:`~areal_tasks.models.memory.layer_activation_bytes`). Torch-free.

Not modelled: interleaved schedules (more micro-batches in flight on a rank), the router's
imbalance (a rank can receive more than ``k`` token copies on average), allocator fragmentation
(:data:`~areal_tasks.models.memory.USABLE_FRACTION` leaves room for it).
"""

from __future__ import annotations

import logging

from areal_tasks.errors import ConfigError
from areal_tasks.models.dims import ModelDims
from areal_tasks.models.memory import dtype_bytes, layer_activation_bytes

logger = logging.getLogger(__name__)

__all__ = ["ARCHON_STATE_BYTES", "archon_bytes_per_token", "archon_static_bytes", "archon_train_bytes"]

#: archon training-state bytes per parameter: the engine keeps fp32 parameters (FSDP casts them to
#: the compute dtype for the forward), fp32 gradients and two fp32 AdamW moments.
ARCHON_STATE_BYTES = 16


def archon_bytes_per_token(dims: ModelDims, *, dtype: str, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """Activation bytes per micro-batch token of the busiest archon stage: every layer's
    activations (the engine recomputes nothing) and the unchunked cross-entropy. With ``pp`` > 1
    under 1F1B the first stage keeps ``pp`` micro-batches of its ``L / pp`` layers (``L`` layers'
    worth, no head) and the last stage one micro-batch of its layers plus the head and CE; the
    larger of the two. Split by ``tp * cp``; expert parallelism moves tokens, not their number."""
    c = dtype_bytes(dtype)
    layer, largest = layer_activation_bytes(dims, c)
    head = dims.hidden_size * (4 + c) + c * dims.hidden_size
    ce = 4 * dims.vocab_size + max(8, c + 4) * dims.vocab_size
    per_token = dims.num_layers * layer + head + ce
    if pp > 1:
        per_token = max(dims.num_layers * layer, -(-dims.num_layers // pp) * largest + head + ce)
    return -(-per_token // (tp * cp))


def archon_static_bytes(
    dims: ModelDims, *, dp: int, dtype: str, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, extra_params: int = 0
) -> tuple[int, int]:
    """``(static + fixed, late transient)`` bytes of one archon training GPU, tokens aside.

    Static: :data:`ARCHON_STATE_BYTES` a parameter of this rank's stage (``1/pp`` of the model),
    FSDP-sharded over ``dp * cp``; dense weights are sliced by TP first, routed experts by EP and
    then FSDP-sharded over the ``dp * cp / ep`` ranks holding the same slice, so every parameter is
    split ``dp * cp`` ways. Fixed: the all-gathered root (embedding and head; one of them on a
    pipeline stage) and two layers (current + prefetch) in the compute dtype, a MoE layer with
    ``1/ep`` of its experts, plus one layer's unsharded gradient and its fp32 reduce copy. Late:
    the optimizer step's temporary (one fp32 moment) and the root's gradient reduce."""
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp), ("ep", ep)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if (dp * cp) % ep:
        raise ConfigError(f"ep={ep} must divide dp * cp = {dp * cp} (experts are split over data-parallel ranks)")
    c = dtype_bytes(dtype)
    experts = dims.routed_expert_params
    local = ((dims.num_params + extra_params - experts) / tp + experts) / (pp * dp * cp)
    layer_experts = dims.num_experts * 3 * dims.hidden_size * dims.moe_intermediate_size
    dense_layer = dims.layer_params(False) / tp if dims.num_dense_layers else 0
    moe_layer = (dims.layer_params(True) - layer_experts) / tp + layer_experts / ep if dims.num_moe_layers else 0
    biggest = max(dense_layer, moe_layer)
    root = dims.root_params if pp == 1 else dims.vocab_size * dims.hidden_size + dims.hidden_size
    fixed = (root / tp + 2 * biggest) * c + biggest * (c + 4)
    late = max(local * 4, root * (c + 4) / tp)
    return int(local * ARCHON_STATE_BYTES + fixed), int(local * ARCHON_STATE_BYTES + late)


def archon_train_bytes(
    dims: ModelDims,
    *,
    dp: int,
    dtype: str,
    tokens_per_gpu: int,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    extra_params: int = 0,
) -> int:
    """Peak bytes of one archon training GPU at ``d{dp}t{tp}p{pp}c{cp}e{ep}`` for micro-batches of
    ``tokens_per_gpu`` tokens: :func:`archon_static_bytes` plus :func:`archon_bytes_per_token`."""
    during, late = archon_static_bytes(dims, dp=dp, dtype=dtype, tp=tp, pp=pp, cp=cp, ep=ep, extra_params=extra_params)
    per_token = archon_bytes_per_token(dims, dtype=dtype, tp=tp, pp=pp, cp=cp)
    return max(during + tokens_per_gpu * per_token, late)
