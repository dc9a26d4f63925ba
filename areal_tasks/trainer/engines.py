"""The engines of an RL job: the actor, and the reference and critic when the algorithm needs them.

Every rank builds the same engines (SPMD) through the engine registry (``actor.backend`` names the
backend) and initialises them before the first step. The allocation is the layout: each engine's
mesh comes from its training component's dims (``d`` -> dp, ``t`` -> tp, ``c`` -> Ulysses sp);
``ref`` and ``critic`` use their own component when the allocation names one (colocated with the
actor, on its ranks), else the actor's. Log-probs are computed at the sampling temperature, so the
trainer scores tokens under the distribution that generated them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.api.train_engine import ForwardEngine, TrainEngine
    from areal_tasks.config.job import JobConfig
    from areal_tasks.engine.parallel.mesh import ParallelDims

logger = logging.getLogger(__name__)


def logprob_temperature(cfg: JobConfig) -> float:
    """The temperature the trainer computes log-probs at: the sampling one (1.0 for greedy)."""
    t = cfg.rollout.sampling.temperature
    return t if t > 0 else 1.0


def actor_layout(cfg: JobConfig) -> ParallelDims:
    """The actor's rank layout: its allocation component's dims."""
    from areal_tasks.config.allocation import parse_allocation
    from areal_tasks.engine.registry import engine_dims, flat_dims

    return engine_dims(cfg.actor.backend, flat_dims(parse_allocation(cfg.allocation).actor()))


def engine_layouts(cfg: JobConfig) -> dict[str, ParallelDims]:
    """Per role (``actor``, ``ref``, ``critic``) the rank layout the allocation gives it."""
    from areal_tasks.config.allocation import parse_allocation
    from areal_tasks.engine.registry import engine_dims, flat_dims

    allocation = parse_allocation(cfg.allocation)
    actor = allocation.actor()
    named = {c.name: c for c in allocation.training() if c.name in ("ref", "critic")}
    out = {"actor": actor_layout(cfg)}
    for role, section in (("ref", cfg.ref or cfg.actor), ("critic", cfg.critic)):
        component = named.get(role)
        if section is None:
            continue
        if component is None:
            out[role] = engine_dims(section.backend, flat_dims(actor))
            continue
        if component.dims.world_size != actor.dims.world_size:
            raise ConfigError(
                f"allocation {cfg.allocation!r}: the {role} component {component.to_spec()} spans "
                f"{component.dims.world_size} ranks, but every engine runs on the actor's {actor.dims.world_size}"
            )
        out[role] = engine_dims(section.backend, flat_dims(component))
    return out


def build_engines(cfg: JobConfig, model_dir: str, n_steps: int) -> dict[str, TrainEngine]:
    """The actor, and the reference and critic engines when the algorithm needs them (initialised)."""
    from areal_tasks.algo import build_algorithm
    from areal_tasks.engine.registry import build_engine
    from areal_tasks.weights.registry import transport_class

    algorithm = build_algorithm(cfg.algorithm)
    layouts = engine_layouts(cfg)
    common: dict[str, Any] = {"total_steps": n_steps, "seed": cfg.experiment.seed}
    temperature = logprob_temperature(cfg)
    # a transport that keeps a copy of the published weights on the trainer's device (shared
    # memory): the engine sizes its micro-batches leaving room for it
    actor_options = (
        {"shared_weight_buffer": True} if transport_class(cfg.rollout.weight_update).keeps_publish_buffer else {}
    )
    engines = {
        "actor": build_engine(
            "actor",
            cfg.actor,
            model_dir,
            parallel=layouts["actor"],
            temperature=temperature,
            **common,
            **actor_options,
        )
    }
    if algorithm.needs_ref:
        engines["ref"] = build_engine(
            "ref", cfg.ref or cfg.actor, model_dir, parallel=layouts["ref"], temperature=temperature, **common
        )
    if algorithm.needs_critic:
        if cfg.critic is None:
            raise ConfigError(f"algorithm {cfg.algorithm.name!r} needs a critic: add a `critic:` engine section")
        engines["critic"] = build_engine("critic", cfg.critic, model_dir, parallel=layouts["critic"], **common)
    for engine in engines.values():
        engine.initialize()
    return engines


def engine_layout(engines: dict[str, ForwardEngine]) -> dict[str, dict[str, int]]:
    """What each engine actually runs, from its own ``parallel``: world size, dp, tp and sp, and pp
    and ep where they are above 1 (for the run's summary: ``engine_layout`` in ``rl_summary.json``
    and ``summary.json``)."""
    out = {}
    for name, engine in engines.items():
        info = engine.parallel
        layout = {"world_size": info.world_size, "dp": info.dp_size, "tp": info.tp_size, "sp": info.sp_size}
        layout.update({dim: size for dim, size in (("pp", info.pp_size), ("ep", info.ep_size)) if size > 1})
        out[name] = layout
    return out


def check_layouts_fit_model(cfg: JobConfig, model_dir: str) -> None:
    """Refuse (ConfigError naming the model fields and the dims) a layout the model cannot run, as
    the engine registry's backends check it (archon: layers against pipeline stages, heads against
    t and c, experts against e). Reads only ``config.json``: fails before any server or worker starts."""
    import json
    from pathlib import Path

    from areal_tasks.engine.registry import model_problems

    sections = {"actor": cfg.actor, "ref": cfg.ref or cfg.actor, "critic": cfg.critic}
    hf_config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    for role, dims in engine_layouts(cfg).items():
        section = sections.get(role)
        problems = [] if section is None else model_problems(section.backend, hf_config, dims, section)
        if problems:
            raise ConfigError(
                f"allocation {cfg.allocation!r}: the {role} cannot run {model_dir}: " + "; ".join(problems)
            )
