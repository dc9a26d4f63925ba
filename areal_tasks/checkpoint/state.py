"""What a checkpoint holds: the engines' sharded state, their small JSON state, and the trainer state.

* Sharded (through DCP): for each engine ``name``, ``engines.<name>.model.*`` and
  ``engines.<name>.optim.*`` from ``torch.distributed.checkpoint.state_dict.get_state_dict`` (FSDP2
  DTensor shards stay shards; no gather).
* ``engines.json``: per engine its LR-scheduler ``state_dict`` and weight version, plus facts the HF
  export needs (role, LoRA scalings, tied embeddings).
* ``trainer_state.json``: :class:`TrainerState` -- step, epoch, policy version, dataloader position,
  executor counters (staleness) and any extra JSON the trainer adds.
* ``rng/rank-<r>.json``: see :mod:`areal_tasks.checkpoint.rng`.

Engines are used through their public attributes only (``model``, ``optimizer``,
``lr_scheduler``, ``get_version``/``set_version``), so any engine shaped like the FSDP engine works.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from areal_tasks.errors import CheckpointError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

ENGINES_KEY = "engines"


@dataclass
class TrainerState:
    """The trainer/executor side of a checkpoint (all JSON)."""

    #: the training step the checkpoint was taken after (the loop resumes at ``step + 1``).
    step: int
    epoch: int = 0
    #: policy (weights) version.
    version: int = 0
    #: the dataloader position (e.g. a ``StatefulDataLoader.state_dict()``, epoch and index).
    dataloader: dict[str, Any] = field(default_factory=dict)
    #: rollout-executor counters: samples produced/consumed, staleness accounting...
    executor: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        try:
            json.dumps(data, allow_nan=True)
        except TypeError as exc:
            raise CheckpointError(f"trainer state must be JSON-serialisable: {exc}") from exc
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainerState:
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise CheckpointError(f"trainer state has an unexpected layout: {exc}") from exc


class CheckpointableEngine(Protocol):
    """The engine surface a checkpoint needs (the FSDP engine has it)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any

    def get_version(self) -> int: ...

    def set_version(self, version: int) -> None: ...


def _check_engines(engines: Mapping[str, CheckpointableEngine]) -> None:
    if not engines:
        raise CheckpointError("a checkpoint needs at least one engine, e.g. engines={'actor': engine}")
    for name, engine in engines.items():
        if not name or "." in name or "/" in name:
            raise CheckpointError(f"engine name {name!r} must be non-empty without '.' or '/'")
        if getattr(engine, "model", None) is None:
            raise CheckpointError(f"engine {name!r} has no model: initialize() it first")


def sharded_state_dict(engines: Mapping[str, CheckpointableEngine]) -> dict[str, Any]:
    """``{"engines": {name: {"model": ..., "optim": ...}}}``: live references to the engines' shards."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    _check_engines(engines)
    out: dict[str, Any] = {}
    for name, engine in engines.items():
        if engine.optimizer is not None:
            started = bool(engine.optimizer.state)
            model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
            if not started:
                # get_state_dict initialises an empty optimizer state with a zero-lr step (AdamW's step
                # count becomes 1); drop it again so that saving before the first step changes nothing
                engine.optimizer.state.clear()
            out[name] = {"model": model_sd, "optim": optim_sd}
        else:
            out[name] = {"model": get_model_state_dict(engine.model)}
    return {ENGINES_KEY: out}


def apply_sharded_state_dict(engines: Mapping[str, CheckpointableEngine], state: Mapping[str, Any]) -> None:
    """Load what :func:`sharded_state_dict` produced (after DCP filled it) into the engines."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    for name, engine in engines.items():
        part = state[ENGINES_KEY][name]
        if engine.optimizer is not None:
            set_state_dict(
                engine.model, engine.optimizer, model_state_dict=part["model"], optim_state_dict=part["optim"]
            )
        else:
            set_model_state_dict(engine.model, part["model"])


def _lora_scalings(model: torch.nn.Module) -> dict[str, float]:
    from areal_tasks.models.lora import lora_scalings

    return lora_scalings(model)


def engine_side_state(engines: Mapping[str, CheckpointableEngine]) -> dict[str, dict[str, Any]]:
    """The JSON part of each engine: LR scheduler, version, whether the optimizer has stepped yet, and
    what the HF export needs."""
    from areal_tasks.models.hf_dir import hf_config_of

    out = {}
    for name, engine in engines.items():
        scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
        config = hf_config_of(engine.model)
        scalings = _lora_scalings(engine.model)
        out[name] = {
            "version": int(engine.get_version()),
            "lr_scheduler": scheduler,
            "role": getattr(engine, "role", "actor"),
            "lora": bool(scalings),
            "lora_scalings": scalings,
            "tied_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
            "model_type": getattr(config, "model_type", None),
            "has_optimizer": engine.optimizer is not None,
            "optimizer_started": engine.optimizer is not None and bool(engine.optimizer.state),
        }
    try:
        json.dumps(out, allow_nan=True)
    except TypeError as exc:
        raise CheckpointError(f"an engine's LR-scheduler state is not JSON-serialisable: {exc}") from exc
    return out


def restore_engine_side_state(engines: Mapping[str, CheckpointableEngine], side: Mapping[str, Any]) -> None:
    """Restore LR schedulers and versions from ``engines.json``."""
    missing = sorted(set(engines) - set(side))
    if missing:
        raise CheckpointError(f"the checkpoint holds no engine named {missing}; it has {sorted(side)}")
    for name, engine in engines.items():
        entry = side[name]
        engine.set_version(int(entry["version"]))
        if engine.lr_scheduler is not None:
            if entry.get("lr_scheduler") is None:
                raise CheckpointError(f"engine {name!r} has an LR scheduler but the checkpoint holds none for it")
            engine.lr_scheduler.load_state_dict(entry["lr_scheduler"])
        if engine.optimizer is not None and not entry.get("optimizer_started", True):
            engine.optimizer.state.clear()  # saved before the first step: no state, as then
