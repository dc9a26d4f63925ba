"""Full HF-named tensors out of a sharded model.

:func:`iter_full_tensors` walks the model's state dict one tensor at a time, gathering each
FSDP/TP shard into the full tensor (a collective: every rank of the engine must iterate, in the same
order). :func:`iter_hf_tensors` renames to plain HF keys, merges LoRA adapters when asked and drops
the tied LM head; :func:`iter_hf_meta` gives the same names, dtypes and shapes without gathering.
Writing them as an HF directory is :func:`areal_tasks.models.hf_dir.write_hf_dir`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from areal_tasks.models.hf_dir import hf_config_of, is_peft_model
from areal_tasks.models.lora import LoraMerger, lora_scalings

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def iter_full_tensors(
    model: torch.nn.Module, device: torch.device, *, in_param_dtype: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(state-dict key, full tensor)`` for every entry; shards are gathered on ``device``.

    A DTensor on a mesh of one device is its own full tensor: it is taken as is (``to_local``),
    without DTensor's redistribution, whose host cost, paid once per tensor, was most of a
    one-GPU weight update. Elsewhere every sharded tensor is gathered with ``full_tensor``, or,
    with ``in_param_dtype`` (a weight update: the tensors may come in the FSDP units' parameter
    dtype, bf16 on GPU), one FSDP unit at a time (:mod:`areal_tasks.engine.fsdp.gather`; LoRA
    models keep the per-tensor path, so adapters merge into fp32 weights).
    """
    from torch.distributed.tensor import DTensor

    from areal_tasks.engine.fsdp.gather import fsdp_units, iter_unsharded_tensors

    state = model.state_dict()
    sharded = any(isinstance(t, DTensor) and t.device_mesh.size() > 1 for t in state.values())
    if in_param_dtype and sharded and fsdp_units(model) and not is_peft_model(model):
        yield from iter_unsharded_tensors(model)
        return
    for name, tensor in state.items():
        yield name, _full(tensor, device)


def _full(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One state-dict entry as a full tensor on ``device``, outside autograd (``to_local`` under
    grad mode is an autograd function, a large share of a one-GPU weight update's host time)."""
    import torch
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        if isinstance(tensor, DTensor) and tensor.device_mesh.size() == 1:
            return tensor.to_local().to(device)
        if isinstance(tensor, DTensor):
            if tensor.device != device:  # CPU-offloaded shards: gather on the compute device
                tensor = DTensor.from_local(
                    tensor.to_local().to(device),
                    tensor.device_mesh,
                    tensor.placements,
                    shape=tensor.shape,
                    stride=tensor.stride(),
                )
            return tensor.full_tensor()
        return tensor.detach()


def iter_hf_tensors(
    model: torch.nn.Module, device: torch.device, *, in_param_dtype: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Plain HF ``(name, tensor)`` pairs: LoRA merged into the base weights, tied LM head dropped
    (``in_param_dtype`` as in :func:`iter_full_tensors`)."""
    return _as_hf(model, iter_full_tensors(model, device, in_param_dtype=in_param_dtype))


def iter_hf_meta(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """What :func:`iter_hf_tensors` yields, as ``meta``-device tensors (names, dtypes, full shapes)
    and in the same order; local, no gather."""
    import torch

    stream = ((name, torch.empty(t.shape, dtype=t.dtype, device="meta")) for name, t in model.state_dict().items())
    return _as_hf(model, stream)


def _as_hf(model: torch.nn.Module, stream: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``stream`` (state-dict keys) with LoRA merged and renamed to HF keys, tied LM head dropped."""
    if is_peft_model(model):
        stream = LoraMerger(lora_scalings(model))(stream)
    config = hf_config_of(model)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for name, tensor in stream:
        if tied and name == "lm_head.weight":
            continue
        yield name, tensor
