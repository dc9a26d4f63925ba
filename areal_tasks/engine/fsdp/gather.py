"""Full tensors of an FSDP2-sharded model, gathered one FSDP unit at a time.

``DTensor.full_tensor`` gathers one tensor per collective: a 24-layer model is 291 all-gathers per
weight update, each with DTensor's host-side redistribution. FSDP2 already knows how to gather a
whole unit (a decoder block, or the root's embedding, final norm and head) in one all-gather:
``FSDPModule.unshard()``. :func:`iter_unsharded_tensors` walks the state dict's keys in order, has
each key's unit unsharded when its first key comes and resharded after its last, and yields a copy
of each tensor (the unsharded storage is freed by the reshard). At most the root unit and one
block are unsharded at a time (the whole model when it is one unit, ``fsdp_wrap="root"``). On two
gloo ranks (CPU, a 24-layer tiny Qwen2) that is several times faster than the per-tensor gathers
(``benchmarks/weight_gather.py``; docs/benchmarks.md, "Weight transfer").

The tensors come in the units' *parameter* dtype: with a bf16 ``MixedPrecisionPolicy`` that is the
bf16 cast of the fp32 masters, bit for bit what a cast after ``full_tensor`` gives. That is what a
weight update publishes; checkpoints want the fp32 masters and keep the per-tensor path. A tensor
still sharded after its unit's unshard (tensor parallelism) is gathered with ``full_tensor``.
Every rank of the engine must iterate, in the same order (the unshards are collectives).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["fsdp_units", "iter_unsharded_tensors"]


def fsdp_units(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module path (``""`` for the root) -> module, for every FSDP2 unit of ``model``, in module order."""
    from torch.distributed.fsdp import FSDPModule

    return {name: module for name, module in model.named_modules() if isinstance(module, FSDPModule)}


def _owner(key: str, unit_paths: list[str]) -> str | None:
    """The deepest unit whose path prefixes ``key`` (the root, ``""``, prefixes every key)."""
    best = None
    for path in unit_paths:
        if (path == "" or key.startswith(path + ".")) and (best is None or len(path) > len(best)):
            best = path
    return best


def _tensor_of(model: torch.nn.Module, key: str) -> torch.Tensor | None:
    """The parameter or buffer named ``key`` as the module holds it now (None when it has none)."""
    try:
        return model.get_parameter(key)
    except AttributeError:
        pass
    try:
        return model.get_buffer(key)
    except AttributeError:
        return None


def iter_unsharded_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(state-dict key, full tensor)`` in state-dict order, gathered per FSDP unit (module doc)."""
    from torch.distributed.tensor import DTensor

    units = fsdp_units(model)
    state = model.state_dict()
    keys = list(state)
    owners = {key: _owner(key, list(units)) for key in keys}
    last = {owner: i for i, owner in enumerate(owners[key] for key in keys)}
    opened: list[str] = []
    try:
        for i, key in enumerate(keys):
            owner = owners[key]
            if owner is not None and owner not in opened:
                units[owner].unshard()
                opened.append(owner)
            tensor = _tensor_of(model, key) if owner is not None else None
            if tensor is None:  # not a parameter or buffer of a unit: the state dict's own entry
                tensor = state[key]
            if isinstance(tensor, DTensor):
                tensor = tensor.full_tensor()
            yield key, tensor.detach().clone()
            if owner is not None and last[owner] == i:
                units[owner].reshard()
                opened.remove(owner)
    finally:
        for owner in reversed(opened):  # an abandoned iteration leaves nothing unsharded
            units[owner].reshard()
