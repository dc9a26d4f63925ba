"""The checkpointable role of an engine whose state is a torch module, a torch optimizer and an LR
scheduler (``api/train_engine.py: CheckpointableEngine``), for any such engine: FSDP2 shards, a plain
module on one process, a tensor-parallel DTensor model. The functions take the pieces;
:class:`ModuleCheckpointing` is the role as a mixin for engines that hold them as attributes.

The sharded state goes through torch's ``torch.distributed.checkpoint.state_dict`` API
(``get_state_dict``/``set_state_dict``), which keeps FSDP2/DTensor shards as shards and handles a
plain module the same way, so ``checkpoint/`` never touches a model or an optimizer. The JSON facts
are the LR schedule, the version, the role and what the HF export needs (LoRA scalings, tied
embeddings, model type), plus whether the optimizer has stepped yet: DCP cannot hold an empty
optimizer state, so an engine saved before its first step is restored to that state explicitly.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.api.train_engine import CheckpointableEngine
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """``{"model": ..., "optim": ...}`` (no ``optim`` without an optimizer): live references to
    this rank's shards, for DCP to save or to load into."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    started = bool(optimizer.state)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    if not started:
        # get_state_dict initialises an empty optimizer state with a zero-lr step (AdamW's step count
        # becomes 1); drop it again so that taking the state before the first step changes nothing
        optimizer.state.clear()
    return {"model": model_sd, "optim": optim_sd}


def load_sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, state: dict[str, Any]) -> None:
    """Apply a :func:`sharded_state` template that DCP filled."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if optimizer is None:
        set_model_state_dict(model, state["model"])
        return
    if "optim" not in state:
        raise EngineError("the checkpoint holds no optimizer state for an engine that has an optimizer")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def engine_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: Any,
    *,
    version: int,
    role: str,
) -> dict[str, Any]:
    """The JSON facts of :meth:`CheckpointableEngine.engine_state`."""
    from areal_tasks.models.hf_dir import hf_config_of
    from areal_tasks.models.lora import lora_scalings

    config = hf_config_of(model)
    scalings = lora_scalings(model)
    return {
        "version": int(version),
        "lr_scheduler": lr_scheduler.state_dict() if lr_scheduler is not None else None,
        "role": role,
        "lora": bool(scalings),
        "lora_scalings": scalings,
        "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "model_type": getattr(config, "model_type", None),
        "has_optimizer": optimizer is not None,
        "optimizer_started": optimizer is not None and bool(optimizer.state),
    }


def load_engine_state(optimizer: torch.optim.Optimizer | None, lr_scheduler: Any, state: dict[str, Any]) -> int:
    """Restore the LR schedule (and an optimizer saved before its first step); returns the version."""
    if lr_scheduler is not None:
        if state.get("lr_scheduler") is None:
            raise EngineError("the engine has an LR scheduler but the checkpoint holds none for it")
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    if optimizer is not None and not state.get("optimizer_started", True):
        optimizer.state.clear()  # saved before the first step: no state, as then
    return int(state["version"])


class ModuleCheckpointing(CheckpointableEngine):
    """The checkpointable role of an engine that holds ``model``, ``optimizer`` (or None) and
    ``lr_scheduler`` (or None) as attributes, with a ``role``, a version in ``_version`` and,
    optionally, the ``model_path`` it was built from (the HF sidecar's tokenizer files)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    role: str
    _version: int

    def sharded_state(self) -> dict[str, Any]:
        return sharded_state(self.model, self.optimizer)

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        load_sharded_state(self.model, self.optimizer, state)

    def engine_state(self) -> dict[str, Any]:
        return engine_state(self.model, self.optimizer, self.lr_scheduler, version=self._version, role=self.role)

    def load_engine_state(self, state: dict[str, Any]) -> None:
        self._version = load_engine_state(self.optimizer, self.lr_scheduler, state)

    def hf_sidecar_files(self) -> dict[str, bytes]:
        from areal_tasks.models.hf_dir import hf_config_of, hf_sidecar_files

        source = getattr(self, "model_path", None)
        return hf_sidecar_files(hf_config_of(self.model), source if isinstance(source, str) else None)
