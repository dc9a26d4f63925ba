"""What a checkpoint holds: the engines' sharded state, their small JSON state, and the trainer state.

* Sharded (through DCP): for each engine ``name``, ``engines.<name>.*`` from the engine's
  ``sharded_state()`` (``engines.<name>.model.*`` and ``engines.<name>.optim.*`` for the engines
  built today; FSDP2 DTensor shards stay shards; no gather).
* ``engines.json``: per engine its ``engine_state()``: LR-scheduler ``state_dict`` and weight
  version, plus facts the HF export needs (role, LoRA scalings, tied embeddings).
* ``trainer_state.json``: :class:`TrainerState` -- step, epoch, policy version, dataloader position,
  executor counters (staleness) and any extra JSON the trainer adds.
* ``rng/rank-<r>.json``: see :mod:`areal_tasks.checkpoint.rng`.

Engines are used through :class:`areal_tasks.api.train_engine.CheckpointableEngine` only: any
engine that implements it is checkpointed, resumed and exported the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_tasks.api.train_engine import CheckpointableEngine
from areal_tasks.errors import AReaLError, CheckpointError

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


def _check_engines(engines: Mapping[str, CheckpointableEngine]) -> None:
    if not engines:
        raise CheckpointError("a checkpoint needs at least one engine, e.g. engines={'actor': engine}")
    for name in engines:
        if not name or "." in name or "/" in name:
            raise CheckpointError(f"engine name {name!r} must be non-empty without '.' or '/'")


def sharded_state_dict(engines: Mapping[str, CheckpointableEngine]) -> dict[str, Any]:
    """``{"engines": {name: engine.sharded_state()}}``: live references to the engines' shards."""
    _check_engines(engines)
    return {ENGINES_KEY: {name: engine.sharded_state() for name, engine in engines.items()}}


def apply_sharded_state_dict(engines: Mapping[str, CheckpointableEngine], state: Mapping[str, Any]) -> None:
    """Load what :func:`sharded_state_dict` produced (after DCP filled it) into the engines."""
    for name, engine in engines.items():
        with _restoring(name):
            engine.load_sharded_state(state[ENGINES_KEY][name])


def engine_side_state(engines: Mapping[str, CheckpointableEngine]) -> dict[str, dict[str, Any]]:
    """The JSON part of each engine (``engine_state()``: LR scheduler, version, whether the optimizer
    has stepped yet, and what the HF export needs)."""
    out = {name: engine.engine_state() for name, engine in engines.items()}
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
        with _restoring(name):
            engine.load_engine_state(dict(side[name]))


@contextlib.contextmanager
def _restoring(name: str) -> Iterator[None]:
    """Turn an engine's refusal of a checkpoint's state into a CheckpointError naming the engine."""
    try:
        yield
    except CheckpointError:
        raise
    except AReaLError as exc:
        raise CheckpointError(f"engine {name!r} cannot take the checkpoint's state: {exc}") from exc
