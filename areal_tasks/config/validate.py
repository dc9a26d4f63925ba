"""Cross-field validation of a whole :class:`JobConfig`, run before anything starts.

Every problem is collected (single-section ranges from :mod:`areal_tasks.config.checks`, then the
rules that relate sections: batch vs group size, algorithm vs critic/ref, allocation vs cluster and
backends -- training backends and dims must be built, per the engine registry --, sequence length
vs micro-batch token caps) and reported in one ConfigError, so a user
fixes a config in one pass.
"""

from __future__ import annotations

import logging
from typing import Any

from areal_tasks.config.build import format_problems
from areal_tasks.config.checks import (
    Problems,
    check_data_and_loop,
    check_engine,
    check_experiment,
    check_rollout,
    check_scheduler,
    check_storage,
)
from areal_tasks.config.cluster import check_cluster
from areal_tasks.config.engine import EngineConfig
from areal_tasks.config.job import JobConfig
from areal_tasks.config.trace import check_trace_section
from areal_tasks.errors import AllocationError, ConfigError
from areal_tasks.weights.registry import WEIGHT_TRANSPORTS, transport_class

logger = logging.getLogger(__name__)


def gpu_only_backends() -> frozenset[str]:
    """Backends that cannot run without GPUs (``cluster.gpus_per_node: 0``), from the inference
    registry and the allocation grammar's training table."""
    from areal_tasks.config.allocation.backends import GPU_ONLY_TRAINING_BACKENDS
    from areal_tasks.inference.registry import gpu_only_inference_backends

    return gpu_only_inference_backends() | GPU_ONLY_TRAINING_BACKENDS


def engines(cfg: JobConfig) -> list[tuple[str, EngineConfig]]:
    """The engine sections that are set, as ``(role, config)``: actor, then ref, then critic."""
    found = [("actor", cfg.actor), ("ref", cfg.ref), ("critic", cfg.critic)]
    return [(role, engine) for role, engine in found if engine is not None]


def uses_groups(algorithm: Any) -> bool:
    """Whether the algorithm normalises or baselines rewards within a group of samples of one prompt."""
    return bool(algorithm.needs_groups)


def _check_batching(p: Problems, cfg: JobConfig) -> None:
    batch, group = cfg.train.batch_size, cfg.rollout.group_size
    if batch >= 1 and group >= 1 and batch % group:
        lower = max(group, batch // group * group)
        p.add(
            "train.batch_size",
            f"must be a positive multiple of rollout.group_size={group} "
            f"(samples per step are whole groups), got {batch}; e.g. {lower} or {lower + group}",
        )
    if uses_groups(cfg.algorithm) and group < 2:
        p.add(
            "rollout.group_size",
            f"algorithm {cfg.algorithm.name!r} compares samples within a group, "
            f"so it needs group_size >= 2, got {group}",
        )
    for role, engine in engines(cfg):
        n_mini = engine.ppo_n_minibatches
        if n_mini < 1 or batch < 1:
            continue
        if batch % n_mini:
            p.add(f"{role}.ppo_n_minibatches", f"must divide train.batch_size={batch}, got {n_mini}")
            continue
        unit = engine.micro_batch.granularity
        if unit >= 1 and (batch // n_mini) % unit:
            p.add(
                f"{role}.micro_batch.granularity",
                f"must divide the mini-batch size train.batch_size / "
                f"{role}.ppo_n_minibatches = {batch // n_mini}, got {unit}",
            )


def _check_lengths(p: Problems, cfg: JobConfig) -> None:
    longest = cfg.dataset.max_prompt_len + cfg.rollout.sampling.max_new_tokens
    why = f"dataset.max_prompt_len + rollout.sampling.max_new_tokens = {longest}"
    for role, engine in engines(cfg):
        cap = engine.micro_batch.max_tokens_per_mb
        if cap is not None and cap < longest:
            p.add(f"{role}.micro_batch.max_tokens_per_mb", f"must fit one whole sequence ({why}), got {cap}")
        if cap is not None and engine.micro_batch.memory_budget_gb is not None:
            p.add(f"{role}.micro_batch", "set max_tokens_per_mb or memory_budget_gb (which sizes it), not both")
    context = cfg.rollout.server.context_length
    if context is not None and context < longest:
        p.add("rollout.server.context_length", f"must be >= {why}, got {context}")
    for role, engine in engines(cfg):
        warmup = engine.lr_schedule.warmup_steps
        if role != "ref" and warmup > 0 and warmup >= cfg.train.total_steps:
            p.add(
                f"{role}.lr_schedule.warmup_steps", f"must be < train.total_steps={cfg.train.total_steps}, got {warmup}"
            )


def _check_algorithm(p: Problems, cfg: JobConfig) -> None:
    algo = cfg.algorithm
    if type(algo).needs_critic and cfg.critic is None:
        p.add("critic", f"algorithm {algo.name!r} needs a critic: set the critic section (e.g. critic.value_head=true)")
    if not type(algo).needs_critic and cfg.critic is not None:
        p.add("critic", f"algorithm {algo.name!r} does not use a critic; remove it (critic=null)")
    kl_coef = getattr(algo, "kl_coef", 0.0)
    if isinstance(kl_coef, (int, float)) and kl_coef > 0 and cfg.ref is None:
        p.add(
            "ref",
            f"algorithm.kl_coef={kl_coef} needs a reference model: set the ref section "
            "(e.g. ref.backend=fsdp) or algorithm.kl_coef=0",
        )


def _check_engine_backends(p: Problems, cfg: JobConfig) -> None:
    """Every engine section names a built training backend (the engine registry's)."""
    from areal_tasks.engine.registry import built_backends

    built = built_backends()
    for role, engine in engines(cfg):
        if engine.backend not in built:
            p.add(
                f"{role}.backend",
                f"training backend {engine.backend!r} is not built; built training backends: {', '.join(built)}",
            )


def _check_training_layout(p: Problems, cfg: JobConfig, alloc: Any) -> None:
    """The allocation's training components name built backends with dims they run, and every one
    runs on the actor's ranks (the trainer builds all engines there, SPMD)."""
    from areal_tasks.engine.registry import (
        built_backends,
        describe_dims,
        engine_dims,
        flat_dims,
        supported_dims,
        unsupported_dims,
    )

    built = built_backends()
    actor = alloc.actor()
    for comp in alloc.training():
        if comp.backend not in built:
            p.add(
                "allocation",
                f"training backend {comp.backend!r} (component {comp.to_spec()!r}) is not built; "
                f"built training backends: {', '.join(built)}",
            )
            continue
        bad = unsupported_dims(comp.backend, comp.dims)
        if bad:
            p.add(
                "allocation",
                f"training backend {comp.backend!r} does not run {', '.join(bad)} (component {comp.to_spec()!r}); "
                f"it runs {describe_dims(supported_dims(comp.backend))}",
            )
        else:
            try:  # a hybrid form that does not fold into one layout, e that does not divide d*c
                engine_dims(comp.backend, flat_dims(comp))
            except ConfigError as exc:
                p.add("allocation", str(exc))
        if comp is not actor and comp.name in ("ref", "critic") and comp.dims.world_size != actor.dims.world_size:
            p.add(
                "allocation",
                f"the {comp.name} component {comp.to_spec()!r} spans {comp.dims.world_size} ranks, but the trainer "
                f"runs every engine on the actor's {actor.dims.world_size} ({actor.to_spec()!r}): colocate it with "
                f"the actor ('|') at that size, or drop it (it then takes the actor's layout)",
            )


def _check_allocation(p: Problems, cfg: JobConfig) -> None:
    from areal_tasks.config.allocation import parse_allocation

    try:
        alloc = parse_allocation(cfg.allocation, total_gpus=None)
    except AllocationError as exc:
        p.add("allocation", str(exc))
        return
    cluster = cfg.cluster
    if cluster.gpus_per_node > 0 and alloc.total_gpus > cluster.nodes * cluster.gpus_per_node:
        p.add(
            "allocation",
            f"{cfg.allocation!r} needs {alloc.total_gpus} GPUs but the cluster has "
            f"cluster.nodes * cluster.gpus_per_node = {cluster.nodes * cluster.gpus_per_node}",
        )
    elif len(alloc.inference()) == 1 and alloc.training() and isinstance(cluster.nodes, int) and cluster.nodes >= 1:
        from areal_tasks.launch.placement import plan_placement

        try:  # a server larger than a node, or GPUs that do not divide among the nodes
            plan_placement(cfg.allocation, cluster)
        except ConfigError as exc:
            p.add("allocation", str(exc))
    inference = alloc.inference()
    if not inference:
        p.add(
            "allocation",
            f"{cfg.allocation!r} has no inference component; rollout needs one, "
            f"e.g. '{cfg.rollout.backend}:d1+{cfg.actor.backend}:d1'",
        )
    for comp in inference:
        if comp.backend != cfg.rollout.backend:
            p.add(
                "rollout.backend",
                f"must match the allocation's inference backend {comp.backend!r} "
                f"(component {comp.label!r}), got {cfg.rollout.backend!r}",
            )
    training = alloc.training()
    if not training:
        p.add(
            "allocation",
            f"{cfg.allocation!r} has no training component; add one, "
            f"e.g. '{cfg.rollout.backend}:d1+{cfg.actor.backend}:d1'",
        )
        return
    _check_training_layout(p, cfg, alloc)
    roles = dict(engines(cfg))
    actor = alloc.actor()
    placed = [("actor", actor)] + [(c.name, c) for c in training if c.name in ("ref", "critic")]
    for role, comp in placed:
        engine = roles.get(role)
        if engine is None:
            p.add(role, f"the allocation places a {role!r} component ({comp.to_spec()}) but {role} is not set")
            continue
        if comp.backend != engine.backend:
            p.add(
                f"{role}.backend",
                f"must match the allocation's training backend {comp.backend!r} "
                f"(component {comp.label!r}), got {engine.backend!r}",
            )
        n_mini, batch, dp = engine.ppo_n_minibatches, cfg.train.batch_size, comp.dims.d
        if n_mini >= 1 and batch >= 1 and batch % n_mini == 0 and (batch // n_mini) % dp:
            p.add(
                "allocation",
                f"the {role}'s data-parallel size d{dp} must divide train.batch_size / "
                f"{role}.ppo_n_minibatches = {batch // n_mini}",
            )
    if cfg.rollout.weight_update in WEIGHT_TRANSPORTS:  # an unknown mode is check_rollout's problem
        for field, problem in transport_class(cfg.rollout.weight_update).placement_problems(cfg, alloc):
            p.add(field, problem)
    if cluster.gpus_per_node == 0:
        gpu_only = gpu_only_backends()
        for comp in alloc.components:
            if comp.backend in gpu_only:
                p.add(
                    "allocation",
                    f"backend {comp.backend!r} needs GPUs but cluster.gpus_per_node is 0 "
                    "(CPU-only); set cluster.gpus_per_node or use embedded/vllm and fsdp",
                )


def collect_problems(cfg: JobConfig) -> list[str]:
    """Every problem of ``cfg``, single-section and cross-section, as ``"<path>: <problem>"`` lines."""
    p = Problems()
    check_experiment(p, cfg.experiment)
    check_cluster(p, cfg.cluster)
    check_scheduler(p, cfg.cluster)
    check_storage(p, cfg.storage)
    p.non_empty("model.path", cfg.model.path)
    if cfg.model.path.startswith("tiny:") and not cfg.model.path[len("tiny:") :].strip():
        p.add("model.path", "a tiny model needs a family, e.g. tiny:qwen2")
    p.non_empty("model.tokenizer_path", cfg.model.tokenizer_path, optional=True)
    for role, engine in engines(cfg):
        check_engine(p, role, engine, trains=role != "ref")
    check_rollout(p, cfg.rollout)
    check_data_and_loop(p, cfg.dataset, cfg.train, cfg.saver, cfg.evaluation, cfg.tracking)
    check_trace_section(p, cfg.trace)
    _check_batching(p, cfg)
    _check_lengths(p, cfg)
    _check_algorithm(p, cfg)
    _check_engine_backends(p, cfg)
    _check_allocation(p, cfg)
    return p.items


def validate_config(cfg: JobConfig) -> None:
    """Raise one ConfigError listing every problem of ``cfg``; return None when it is valid."""
    problems = collect_problems(cfg)
    if problems:
        raise ConfigError(format_problems(problems))
    logger.debug("configuration is valid")
