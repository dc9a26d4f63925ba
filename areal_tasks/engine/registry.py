"""Training backends by name: ``actor.backend`` (and ``ref``/``critic``) -> the engine class, and the
parallel dims each one runs.

Built: ``fsdp`` (d, t, c) and ``archon`` (d, t, p, c, e). The allocation grammar knows ``megatron``
too; validation (``config/validate.py``) refuses every backend and every dim that is not registered
here, before anything starts, naming what is. Entries are ``"module:Class"`` strings imported on first use, so
this module (and validation) imports no torch.

An engine class is called as ``cls(config, model_path, *, parallel, total_steps, trainable,
temperature, seed, **options)``: ``config`` the role's :class:`~areal_tasks.config.engine.EngineConfig`
(a critic's with ``value_head=True``), ``parallel`` the rank layout as
:class:`~areal_tasks.engine.parallel.mesh.ParallelDims` (None: data parallel over the whole world),
``trainable`` False for a forward-only reference model, ``temperature`` the one log-probs are
computed at; ``options`` are backend-specific (the FSDP engine's ``shared_weight_buffer``). It
implements :class:`~areal_tasks.api.train_engine.TrainEngine` and is returned uninitialised.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Literal

from areal_tasks.errors import ConfigError
from areal_tasks.registry import Registry

if TYPE_CHECKING:
    from areal_tasks.api.train_engine import TrainEngine
    from areal_tasks.config.allocation.model import Component
    from areal_tasks.config.allocation.model import ParallelDims as AllocationDims
    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.parallel.mesh import ParallelDims

logger = logging.getLogger(__name__)

__all__ = [
    "ENGINES",
    "EngineRole",
    "build_engine",
    "built_backends",
    "engine_dims",
    "flat_dims",
    "hybrid_backends",
    "model_problems",
    "register_engine",
    "supported_dims",
    "unregister_engine",
    "unsupported_dims",
]

#: what an engine is built for: the policy, the frozen reference (no optimizer), the value model.
EngineRole = Literal["actor", "ref", "critic"]
ROLES: tuple[str, ...] = ("actor", "ref", "critic")

#: the training backends that are built: name -> engine class.
ENGINES: Registry[type[TrainEngine]] = Registry(
    "training backend",
    {"fsdp": "areal_tasks.engine.fsdp.engine:FSDPEngine", "archon": "areal_tasks.engine.archon.engine:ArchonEngine"},
    error=ConfigError,
)

#: the allocation dims (``d``, ``t``, ``p``, ``c``, ``e``) each built backend runs, in that order.
_DIMS: dict[str, str] = {"fsdp": "dtc", "archon": "dtpce"}

#: per backend, ``"module:function"`` of ``fn(hf_config: dict, dims: ParallelDims, config: EngineConfig)
#: -> list[str]``: why a model cannot run at a layout (checked before a job starts).
_MODEL_CHECKS: dict[str, str] = {
    "archon": "areal_tasks.engine.archon.layout:model_problems",
    "fsdp": "areal_tasks.engine.vision:model_problems",
}

#: built backends that take the MoE hybrid form ``backend:(attn:...|ffn:...)`` (:func:`flat_dims`).
_HYBRID: set[str] = {"archon"}

_DIM_WORDS = {"d": "data", "t": "tensor", "p": "pipeline", "c": "context (Ulysses sp)", "e": "expert"}


def built_backends() -> tuple[str, ...]:
    """The names of the built training backends, sorted."""
    return ENGINES.names()


def hybrid_backends() -> tuple[str, ...]:
    """The built backends that take the MoE hybrid form, sorted."""
    return tuple(sorted(_HYBRID))


def flat_dims(component: Component) -> AllocationDims:
    """An allocation component's dims as one layout: its plain dims, or a hybrid form
    ``archon:(attn:dAtTpPcC|ffn:dDtTpPeE)`` folded into ``dAtTpPcCeE``. Experts are split over the
    data- and context-parallel ranks of attention, so the two halves must agree on t and p
    (ConfigError naming them otherwise)."""
    from areal_tasks.config.allocation.model import ParallelDims as Dims

    hybrid = component.hybrid
    if hybrid is None:
        return component.dims
    attn, ffn = hybrid.attn, hybrid.ffn
    # the grammar already made both halves span the same ranks (d*t*p*c == d*t*p*e), so equal t
    # and p leave the ffn's d*e equal to the attention's d*c
    if attn.t != ffn.t or attn.p != ffn.p:
        raise ConfigError(
            f"hybrid layout {component.to_spec()!r}: t and p must be equal in both halves "
            f"(attn t{attn.t}p{attn.p}, ffn t{ffn.t}p{ffn.p}): archon splits experts over the attention's "
            "data- and context-parallel ranks"
        )
    return Dims(d=attn.d, t=attn.t, p=attn.p, c=attn.c, e=ffn.e)


def supported_dims(backend: str) -> str:
    """The allocation dim letters ``backend`` runs (ConfigError naming the built ones if unknown)."""
    ENGINES.check(backend)
    return _DIMS[backend]


def describe_dims(letters: str) -> str:
    """``d (data), t (tensor)``: dim letters in words."""
    return ", ".join(f"{letter} ({_DIM_WORDS[letter]})" for letter in letters)


def unsupported_dims(backend: str, dims: AllocationDims) -> list[str]:
    """The dims of ``dims`` above 1 that ``backend`` does not run, e.g. ``["p2"]``."""
    allowed = supported_dims(backend)
    return [f"{letter}{size}" for letter, size in dims.to_dict().items() if size > 1 and letter not in allowed]


def register_engine(name: str, target: str | type[TrainEngine], *, dims: str = "d", replace: bool = False) -> None:
    """Register a training backend: ``target`` an engine class or ``"module:Class"``; ``dims`` the
    allocation dims it runs (``"d"``: data parallel only)."""
    unknown = sorted(set(dims) - set(_DIM_WORDS))
    if unknown or "d" not in dims:
        raise ConfigError(f"engine {name!r}: dims {dims!r} must include 'd' and use only {''.join(_DIM_WORDS)}")
    ENGINES.register(name, target, replace=replace)
    _DIMS[name] = "".join(letter for letter in _DIM_WORDS if letter in dims)


def unregister_engine(name: str) -> None:
    """Remove a backend (tests register temporary ones)."""
    ENGINES.unregister(name)
    _DIMS.pop(name, None)
    _HYBRID.discard(name)


def engine_dims(backend: str, dims: AllocationDims) -> ParallelDims:
    """The engine's rank layout for an allocation component's dims: ``d`` -> dp, ``t`` -> tp,
    ``c`` -> Ulysses sp, ``p`` -> pp, ``e`` -> ep. Refuses (ConfigError) a dim the backend does not run."""
    from areal_tasks.engine.parallel.mesh import ParallelDims

    bad = unsupported_dims(backend, dims)
    if bad:
        runs = describe_dims(supported_dims(backend))
        raise ConfigError(f"training backend {backend!r} does not run {', '.join(bad)}; it runs {runs}")
    from areal_tasks.errors import EngineError

    try:
        return ParallelDims(dp=dims.d, sp=dims.c, tp=dims.t, pp=dims.p, ep=dims.e)
    except EngineError as exc:
        raise ConfigError(f"allocation {dims.to_spec()!r}: {exc}") from exc


def model_problems(backend: str, hf_config: dict, dims: ParallelDims, config: EngineConfig) -> list[str]:
    """Why the model whose ``config.json`` is ``hf_config`` cannot run on ``backend`` at ``dims``
    (empty: it can, or the backend checks nothing before it builds)."""
    import importlib

    ENGINES.check(backend)
    target = _MODEL_CHECKS.get(backend)
    if target is None:
        return []
    module, _, function = target.partition(":")
    return list(getattr(importlib.import_module(module), function)(hf_config, dims, config))


def build_engine(
    role: EngineRole,
    config: EngineConfig,
    model_path: str,
    *,
    parallel: ParallelDims | None,
    total_steps: int,
    temperature: float = 1.0,
    seed: int = 1,
    **options: object,
) -> TrainEngine:
    """The (uninitialised) engine of ``role`` from ``config.backend``: a ``ref`` is forward-only, a
    ``critic`` gets a value head."""
    if role not in ROLES:
        raise ConfigError(f"engine role must be one of {ROLES}, got {role!r}")
    if role == "critic" and not config.value_head:
        config = dataclasses.replace(config, value_head=True)
    engine_cls = ENGINES.get(config.backend)
    logger.info("building the %s engine: %s (%s)", role, config.backend, parallel or "dp over the world")
    return engine_cls(
        config,
        model_path,
        parallel=parallel,
        total_steps=total_steps,
        trainable=role != "ref",
        temperature=temperature,
        seed=seed,
        **options,
    )
