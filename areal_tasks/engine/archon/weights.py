"""What leaves an archon engine as HF weights: the HF save and load, the DCP train state, and the
weight source the transports publish to inference servers (``api/weights.py``).

Every rank walks the same global order of parameters (:func:`state.iter_full_weights`: gathered by
the owning stage, broadcast over the pipeline ranks), turns archon names into HF names (experts
unstacked into the per-expert names HF checkpoints use) and yields full tensors; rank 0 writes or
publishes them. Floating-point weights are published in the engine's compute dtype, as the FSDP
engine does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.engine.archon.engine import ArchonEngine

logger = logging.getLogger(__name__)

__all__ = ["iter_hf_weights", "load_dcp", "load_hf", "save_dcp", "save_hf", "weight_specs"]

TRAIN_STATE = "train_state.json"


def _pp(engine: ArchonEngine) -> tuple[Any, int]:
    if engine.mesh.dims.pp == 1:
        return None, 0
    return engine.mesh.group("pp"), engine.mesh.pp_rank


def iter_archon_weights(engine: ArchonEngine) -> Iterator[tuple[str, torch.Tensor]]:
    """``(archon name, full tensor)`` for every parameter, on every rank (a collective)."""
    from areal_tasks.engine.archon.state import iter_full_weights

    pp_group, pp_rank = _pp(engine)
    return iter_full_weights(
        engine.parts,
        engine.weight_order,
        owner_of=engine.owner_of,
        pp_group=pp_group,
        pp_rank=pp_rank,
        device=engine.device,
    )


def iter_hf_weights(engine: ArchonEngine) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full tensor)`` in the order :func:`weight_specs` names them (a collective)."""
    from areal_tasks.engine.archon.model.hf_io import archon_to_hf

    for name, tensor in iter_archon_weights(engine):
        yield from archon_to_hf(name, tensor, engine.args)


def publish_dtype(engine: ArchonEngine) -> torch.dtype:
    import torch

    from areal_tasks.engine.fsdp.build import compute_dtype_name

    return getattr(torch, compute_dtype_name(engine.config.dtype, engine.device))


def weight_specs(engine: ArchonEngine) -> list[ParamSpec]:
    """Name, dtype and full shape of every tensor :func:`iter_hf_weights` yields (local: no gather)."""
    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.engine.archon.model.hf_io import archon_to_hf

    dtype = publish_dtype(engine)
    specs = []
    for name, shape in engine.weight_order:
        for hf_name, meta in archon_to_hf(name, torch.empty(shape, device="meta"), engine.args):
            specs.append(ParamSpec(hf_name, str(dtype).removeprefix("torch."), tuple(meta.shape)))
    return specs


def save_hf(engine: ArchonEngine, path: str) -> None:
    """Full weights as an HF directory that plain ``transformers`` loads (rank 0 writes)."""
    import torch.distributed as dist

    from areal_tasks.models.hf_dir import write_hf_dir

    is_rank0 = dist.get_rank() == 0
    tensors = {}
    for name, tensor in iter_hf_weights(engine):
        if is_rank0:
            tensors[name] = tensor.detach().cpu().clone()
    if is_rank0:
        write_hf_dir(path, tensors, engine.hf_config_obj, source_dir=engine.model_path, on_exists="replace_owned")
    dist.barrier()


def load_hf(engine: ArchonEngine, path: str) -> None:
    """Copy HF weights from ``path`` into this rank's shards (every rank reads the files)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    from areal_tasks.engine.archon.model.hf_io import hf_to_archon
    from areal_tasks.models.safetensors_dir import read_safetensors_dir

    state = hf_to_archon(read_safetensors_dir(Path(path)), engine.args)
    with torch.no_grad():
        for part in engine.parts:
            for name, param in part.named_parameters():
                # a pipeline's last stage holds its own copy of a tied head: the embedding's weights
                source = "embed_tokens.weight" if name == "lm_head.weight" and engine.args.tie_word_embeddings else name
                if source not in state:
                    raise EngineError(f"{path} has no weights for {source!r}")
                full = state[source].to(param.dtype)
                if isinstance(param, DTensor):
                    param.copy_(distribute_tensor(full.to(param.device), param.device_mesh, param.placements))
                else:
                    param.copy_(full)


def save_dcp(engine: ArchonEngine, path: str, *, with_optimizer: bool = True) -> None:
    """The resharding train state (:mod:`state`) and the version/LR schedule, as one directory."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from areal_tasks.engine.archon.state import sharded_state
    from storage.atomic import publish_directory, staging_directory

    box = [str(staging_directory(path)) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    staging = Path(box[0])
    tied = engine.args.tie_word_embeddings
    state = sharded_state(engine.parts, engine.optimizer if with_optimizer else None, tied=tied)
    dcp.save(state, checkpoint_id=str(staging))
    dist.barrier()
    if dist.get_rank() == 0:
        (staging / TRAIN_STATE).write_text(json.dumps(engine.engine_state(), indent=2, sort_keys=True))
        publish_directory(staging, path, on_exists="replace_owned")
    dist.barrier()


def load_dcp(engine: ArchonEngine, path: str, *, with_optimizer: bool = True) -> None:
    """Restore what :func:`save_dcp` wrote, at this engine's layout (any layout saved it)."""
    import torch.distributed.checkpoint as dcp

    from areal_tasks.engine.archon.state import load_sharded, sharded_state

    target = Path(path)
    if not (target / TRAIN_STATE).is_file():
        raise EngineError(f"{target} is not a complete archon DCP checkpoint (no {TRAIN_STATE})")
    optimizer = engine.optimizer if with_optimizer else None
    tied = engine.args.tie_word_embeddings
    state = sharded_state(engine.parts, optimizer, tied=tied)
    dcp.load(state, checkpoint_id=str(target))
    load_sharded(engine.parts, optimizer, state, tied=tied)
    engine.load_engine_state(json.loads((target / TRAIN_STATE).read_text()))
