"""The engines of an RL job: the actor, and the reference and critic when the algorithm needs them.

Every rank builds the same engines (SPMD) and initialises them before the first step. Log-probs are
computed at the sampling temperature, so the trainer scores tokens under the distribution that
generated them.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.engine.fsdp.engine import FSDPEngine

logger = logging.getLogger(__name__)


def logprob_temperature(cfg: JobConfig) -> float:
    """The temperature the trainer computes log-probs at: the sampling one (1.0 for greedy)."""
    t = cfg.rollout.sampling.temperature
    return t if t > 0 else 1.0


def build_engines(cfg: JobConfig, model_dir: str, n_steps: int) -> dict[str, FSDPEngine]:
    """The actor, and the reference and critic engines when the algorithm needs them (initialised)."""
    from areal_tasks.algo import build_algorithm
    from areal_tasks.engine.fsdp.engine import FSDPEngine

    algorithm = build_algorithm(cfg.algorithm)
    temperature, seed = logprob_temperature(cfg), cfg.experiment.seed
    engines = {
        "actor": FSDPEngine(
            cfg.actor,
            model_dir,
            total_steps=n_steps,
            temperature=temperature,
            seed=seed,
            shared_weight_buffer=cfg.rollout.weight_update == "shared",
        )
    }
    if algorithm.needs_ref:
        ref_cfg = cfg.ref or cfg.actor
        engines["ref"] = FSDPEngine(
            ref_cfg, model_dir, total_steps=n_steps, trainable=False, temperature=temperature, seed=seed
        )
    if algorithm.needs_critic:
        if cfg.critic is None:
            raise ConfigError(f"algorithm {cfg.algorithm.name!r} needs a critic: add a `critic:` engine section")
        critic_cfg = replace(cfg.critic, value_head=True)
        engines["critic"] = FSDPEngine(critic_cfg, model_dir, total_steps=n_steps, seed=seed)
    for engine in engines.values():
        engine.initialize()
    return engines
