"""What the FSDP engine offers a weight transport (``api/weights.py``, ``WeightSource``).

The transports (``areal_tasks.weights``: disk, collective, shared memory) publish whatever
:func:`iter_weights` yields in the order and dtypes :func:`weight_specs` names; this module is the
engine-specific part of that: full HF-named tensors gathered out of the FSDP/TP shards
(:mod:`areal_tasks.engine.fsdp.export`: one FSDP unit at a time, LoRA merged, tied head dropped).

**Publish dtype.** Every floating-point tensor is published in the engine's *compute* dtype
(:func:`publish_dtype`: ``compute_dtype_name(config.dtype, device)``, bf16 on GPU by default, fp32
on CPU), not in the dtype of the fp32 master weights FSDP keeps: the servers run the compute dtype
anyway, and fp32 would send twice the bytes. :func:`weight_specs` applies that cast to meta tensors,
so the plan the servers get and the bytes agree; :func:`iter_weights` yields the tensors as
gathered (in the FSDP units' parameter dtype) and the transport casts each one while copying it
where it goes. Integer tensors pass unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.engine.fsdp.engine import FSDPEngine

logger = logging.getLogger(__name__)

__all__ = ["cast_floating", "iter_weights", "publish_dtype", "weight_specs"]


def publish_dtype(engine: FSDPEngine) -> torch.dtype:
    """The dtype floating-point weights are published in: the engine's compute dtype."""
    import torch

    from areal_tasks.engine.fsdp.build import compute_dtype_name

    return getattr(torch, compute_dtype_name(engine.config.dtype, engine.device))


def cast_floating(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` with every floating-point tensor cast to ``dtype`` (lazily, one at a time;
    integer and bool tensors unchanged). Works on ``meta`` tensors, so specs and bytes share it."""
    for name, tensor in named_tensors:
        yield name, (tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor)


def weight_specs(engine: FSDPEngine) -> list[ParamSpec]:
    """Name, dtype and full shape of every tensor :func:`iter_weights` yields, in its order
    (floating-point ones in :func:`publish_dtype`).

    Local (no gather): any rank may call it, at any time. They never change during a run, so the
    engine keeps them (``FSDPEngine.weight_specs``) instead of walking the state dict every update.
    """
    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.engine.fsdp.export import iter_hf_meta

    return [
        ParamSpec(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape))
        for name, tensor in cast_floating(iter_hf_meta(engine.model), publish_dtype(engine))
    ]


def iter_weights(engine: FSDPEngine) -> Iterator[tuple[str, torch.Tensor]]:
    """The full HF-named tensors of an actor, gathered shard by shard (every rank of the engine
    must iterate to the end, in step: the gathers are collectives), in the FSDP units' parameter
    dtype (a floating-point one; the transport casts to :func:`publish_dtype`)."""
    from areal_tasks.engine.fsdp.export import iter_hf_tensors

    if engine.role != "actor":
        raise EngineError(f"only an actor publishes weights to inference servers, this engine is a {engine.role}")
    return iter_hf_tensors(engine.model, engine.device, in_param_dtype=True)
