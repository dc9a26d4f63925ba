"""Saving and loading the FSDP2 engine: DCP (sharded, resumable) and HF (full weights).

DCP: every rank writes its shards of the model and optimizer with ``torch.distributed.checkpoint``
into a staging directory next to ``path``; rank 0 adds ``train_state.json`` (LR-schedule state and
policy version) and renames the staging directory into place, so a checkpoint directory is always
complete. Loading restores model, optimizer, schedule and version exactly: training continues
bit-identically. The directory must be on a filesystem every rank sees (local for one node, NFS).

HF: shards are gathered tensor by tensor; rank 0 writes sharded safetensors, ``config.json`` and
the tokenizer files atomically (:mod:`areal_tasks.engine.fsdp.export`). LoRA models write the
merged weights, or only the adapters (``adapter_model.safetensors`` + ``adapter_config.json``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.engine.fsdp.export import iter_full_tensors, iter_hf_tensors
from areal_tasks.errors import EngineError
from areal_tasks.models.hf_dir import hf_config_of, is_peft_model, write_hf_dir
from areal_tasks.models.safetensors_dir import read_safetensors_dir
from storage.atomic import atomic_directory

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

TRAIN_STATE = "train_state.json"


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def save_dcp(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    train_state: dict[str, Any],
) -> None:
    """Write model (+ optimizer) shards and ``train_state`` (JSON-able) as one complete directory:
    rank 0 makes a staging directory, every rank writes its shards into it, rank 0 adds the train
    state and publishes it (:mod:`storage.atomic`), so ``path`` is never half written."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    from storage.atomic import publish_directory, staging_directory

    staging_box = [str(staging_directory(path)) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(staging_box, src=0)
    staging = Path(staging_box[0])
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp.save(state, checkpoint_id=str(staging))
    _barrier()
    if dist.get_rank() == 0:
        (staging / TRAIN_STATE).write_text(json.dumps(train_state, indent=2, sort_keys=True))
        publish_directory(staging, path, on_exists="replace_owned")
        logger.info("saved DCP checkpoint %s", path)
    _barrier()


def load_dcp(
    path: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Restore what :func:`save_dcp` wrote (the optimizer only when given); returns ``train_state``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    target = Path(path)
    if not (target / TRAIN_STATE).is_file():
        raise EngineError(f"{target} is not a complete DCP checkpoint (no {TRAIN_STATE})")
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(target))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(target))
        set_model_state_dict(model, state["model"])
    return json.loads((target / TRAIN_STATE).read_text())


def save_hf(
    path: str | os.PathLike[str],
    model: torch.nn.Module,
    device: torch.device,
    *,
    source_dir: str | None,
    lora_adapters_only: bool = False,
    max_shard_bytes: int | None = None,
) -> None:
    """Gather full weights (collective) and write an HF directory from rank 0."""
    import torch.distributed as dist

    is_rank0 = dist.get_rank() == 0
    if lora_adapters_only:
        if not is_peft_model(model):
            raise EngineError("lora_adapters_only export needs a LoRA model")
        _save_adapters(path, model, device, is_rank0)
    else:
        tensors = {}
        for name, tensor in iter_hf_tensors(model, device):
            if is_rank0:
                tensors[name] = tensor.cpu()
        if is_rank0:
            kwargs = {} if max_shard_bytes is None else {"max_shard_bytes": max_shard_bytes}
            write_hf_dir(path, tensors, hf_config_of(model), source_dir=source_dir, on_exists="replace_owned", **kwargs)
    _barrier()


def _save_adapters(path: str | os.PathLike[str], model: torch.nn.Module, device: torch.device, is_rank0: bool) -> None:
    from safetensors.torch import save_file

    from areal_tasks.models.lora import adapter_state_dict

    full = {}
    for name, tensor in iter_full_tensors(model, device):
        if is_rank0 and ".lora_" in name:
            full[name] = tensor.cpu()
    if is_rank0:
        adapters = adapter_state_dict(model, full)
        with atomic_directory(path, on_exists="replace_owned") as staging:
            save_file({k: v.contiguous() for k, v in adapters.items()}, str(staging / "adapter_model.safetensors"))
            model.peft_config["default"].save_pretrained(str(staging))


def load_hf(path: str | os.PathLike[str], model: torch.nn.Module) -> None:
    """Load full HF weights (every rank reads ``path``) into the sharded model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if is_peft_model(model):
        raise EngineError("loading HF weights into a LoRA engine is not supported; resume LoRA runs from DCP")
    full = read_safetensors_dir(path)
    if getattr(hf_config_of(model), "tie_word_embeddings", False) and "lm_head.weight" not in full:
        full["lm_head.weight"] = full["model.embed_tokens.weight"]
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, strict=True))
    logger.info("loaded HF weights from %s", path)
