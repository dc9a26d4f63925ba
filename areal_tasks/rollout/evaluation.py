"""The one evaluation rule, shared by the RL loop's evaluation and ``evaluate_checkpoint``.

A policy is evaluated with the job's workflow and ``rollout.sampling`` at ``evaluation.temperature``
(0 = greedy) and **no shared seed** (:func:`eval_sampling`): a seed given to every request makes
the server draw the same uniform numbers for every prompt, so the prompts share one random draw
and the score is a single sample of a very wide distribution. Each prompt is sampled
``evaluation.n_samples`` times when sampling, once when greedy (:func:`samples_per_prompt`).
:func:`run_episodes` runs the episodes concurrently, bounded like the rollout executor, then closes
what the workflow holds on the loop (``RolloutWorkflow.aclose``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from areal_tasks.api.inference import SamplingParams

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine
    from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
    from areal_tasks.config.job import JobConfig

__all__ = ["eval_sampling", "run_episodes", "samples_per_prompt"]


def eval_sampling(cfg: JobConfig) -> SamplingParams:
    """``rollout.sampling`` at ``evaluation.temperature`` with no seed: every request draws independently."""
    return replace(SamplingParams.from_config(cfg.rollout.sampling), temperature=cfg.evaluation.temperature, seed=None)


def samples_per_prompt(cfg: JobConfig) -> int:
    """``evaluation.n_samples`` (at least 1) when sampling; 1 for greedy decoding (temperature 0)."""
    return max(1, cfg.evaluation.n_samples) if cfg.evaluation.temperature > 0 else 1


async def run_episodes(
    engine: InferenceEngine,
    workflow: RolloutWorkflow,
    records: list[Any],
    concurrency: int,
    on_done: Callable[[], None] | None = None,
) -> list[Trajectory | None]:
    """One episode of ``workflow`` per record, at most ``concurrency`` at a time, in record order;
    ``on_done()`` after each episode (a progress bar's update)."""
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(record: Any) -> Trajectory | None:
        async with limit:
            trajectory = await workflow.arun_episode(engine, record)
        if on_done is not None:
            on_done()
        return trajectory

    try:
        return list(await asyncio.gather(*(one(r) for r in records)))
    finally:
        await workflow.aclose()
