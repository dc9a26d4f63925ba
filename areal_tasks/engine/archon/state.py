"""The archon engine's state as others see it: DCP-resharding checkpoint state, and the full
HF-named weights for export and weight updates.

**Checkpoints reshard.** A rank holds only its pipeline stages' parameters, sharded by FSDP (and by
tensor and expert parallelism), but every parameter keeps its global name (``layers.5.mlp...``: a
stage keeps the keys of the layers it owns) and its global shape (a DTensor). The state goes to DCP
as torch's ``get_model_state_dict`` / ``get_optimizer_state_dict`` per stage module, with the
optimizer state *flattened* (``state.layers.5....exp_avg``, ``param_groups.layers.5....lr``): keyed by
parameter name rather than by position in one rank's optimizer, so a checkpoint written at one
layout (p2) loads at any other (d2, e2...) and DCP reads each rank's shards of each tensor.

**Full weights.** :func:`iter_full_weights` walks the parameters in one global order on every rank:
the stage that owns a tensor gathers it (``full_tensor``: FSDP, tensor and expert shards) and, with
pipeline parallelism, broadcasts it to the other stages, so every rank yields the same full tensors
(rank 0 writes them). Archon names become HF names (experts unstacked) on the way out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

__all__ = ["iter_full_weights", "load_sharded", "sharded_state"]


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True, **kwargs)


_HEAD, _EMBED = "lm_head.weight", "embed_tokens.weight"


def _canonical(key: str, part: torch.nn.Module, tied: bool) -> str | None:
    """The checkpoint key of a state key: a tied LM head is saved as the embedding it shares (one
    entry whatever the layout); None where the part's embedding entry already covers it."""
    if not tied or _HEAD not in key:
        return key
    if getattr(part, "embed_tokens", None) is not None:
        return None
    return key.replace(_HEAD, _EMBED)


def _source(key: str, part: torch.nn.Module, tied: bool) -> str:
    """The checkpoint key a state key is loaded from (:func:`_canonical`, the head's alias included)."""
    return key.replace(_HEAD, _EMBED) if tied and _HEAD in key else key


def _part_states(
    part: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = get_model_state_dict(part, options=_options())
    optim = None if optimizer is None else get_optimizer_state_dict(part, optimizer, options=_options())
    return model, optim


def sharded_state(
    parts: Sequence[torch.nn.Module], optimizer: torch.optim.Optimizer | None, *, tied: bool = False
) -> dict[str, Any]:
    """``{"model": {name: shard}, "optim": {flat key: shard}}`` of this rank's stage modules (live
    references; no ``optim`` without an optimizer). Taking it changes nothing. ``tied``: the model
    ties its LM head to its embedding (saved once, under the embedding's name)."""
    started = optimizer is not None and bool(optimizer.state)
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for part in parts:
        part_model, part_optim = _part_states(part, optimizer)
        for key, value in part_model.items():
            if (name := _canonical(key, part, tied)) is not None:
                model[name] = value
        for key, value in (part_optim or {}).items():
            if (name := _canonical(key, part, tied)) is not None:
                optim[name] = value
    if optimizer is None:
        return {"model": model}
    if not started:  # the call initialises an empty state with a zero-lr step; keep "not started"
        optimizer.state.clear()
    return {"model": model, "optim": optim}


def load_sharded(
    parts: Sequence[torch.nn.Module],
    optimizer: torch.optim.Optimizer | None,
    state: dict[str, Any],
    *,
    tied: bool = False,
) -> None:
    """Apply a :func:`sharded_state` template that DCP filled."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    if optimizer is not None and "optim" not in state:
        raise EngineError("the checkpoint holds no optimizer state for an engine that has an optimizer")
    for part in parts:
        own_model, own_optim = _part_states(part, optimizer)
        model = {key: state["model"][_source(key, part, tied)] for key in own_model}
        set_model_state_dict(part, model, options=_options())
        if optimizer is not None:
            optim = {key: state["optim"][_source(key, part, tied)] for key in own_optim or {}}
            set_optimizer_state_dict(part, optimizer, optim, options=_options())


def owned_names(parts: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """``{archon name: parameter}`` of this rank's stage modules."""
    out: dict[str, torch.Tensor] = {}
    for part in parts:
        out.update(dict(part.named_parameters()))
    return out


def iter_full_weights(
    parts: Sequence[torch.nn.Module],
    order: Sequence[tuple[str, tuple[int, ...]]],
    *,
    owner_of: dict[str, int],
    pp_group: ProcessGroup | None,
    pp_rank: int,
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(archon name, full tensor)`` in ``order`` (``(name, full shape)`` pairs, the same on every
    rank) on every rank: gathered by the owning stage, broadcast over ``pp_group`` from
    ``owner_of[name]`` (the pipeline rank holding it). A collective: every rank iterates to the end."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    mine = owned_names(parts)
    for name, shape in order:
        owner = owner_of[name]
        if owner == pp_rank:
            if name not in mine:
                raise EngineError(f"pipeline rank {pp_rank} should hold {name!r} but does not")
            param = mine[name].detach()
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if pp_group is not None:
                full = full.contiguous()
        else:  # a stage keeps every parameter in one dtype (the FSDP units' master dtype)
            dtype = next(iter(mine.values())).dtype if mine else torch.float32
            full = torch.empty(shape, dtype=dtype, device=device)
        if pp_group is not None:
            dist.broadcast(full, group=pp_group, group_src=owner)
        yield name, full
