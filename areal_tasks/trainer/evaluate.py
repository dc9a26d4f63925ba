"""Evaluate a model on the eval split through ONE embedded inference server, as the trainer does.

``evaluate(cfg, model_dir, n_prompts)`` starts a server for ``model_dir`` (the job's
``rollout.backend`` command line, through :func:`~areal_tasks.inference.launch.one_server.one_server`)
and measures exactly what the RL loop's own evaluation (:meth:`areal_tasks.rollout.side.RolloutSide.evaluate`,
``reward_before`` / ``reward_after``) measures, so that a checkpoint's number here can be compared
with -- and gated against -- the trainer's:

- the same episodes: the job's ``rollout.workflow`` (chat template with the system prompt,
  ``dataset.max_prompt_len``; a rejected prompt or an empty output scores 0) scored by the job's
  ``rollout.reward.fn`` in a :class:`~areal_tasks.rollout.rewards.RewardRunner`;
- the same sampling and samples per prompt (:mod:`areal_tasks.rollout.evaluation`: ``rollout.sampling``
  at ``evaluation.temperature``, no shared seed, ``evaluation.n_samples`` samples of each prompt
  when sampling, one when greedy);
- the same prompts and count: the first ``n_prompts`` eval prompts (None: ``evaluation.max_eval_prompts``,
  else all of them, as the trainer).

It returns the mean reward, the accuracy (share of episodes with reward >= 1), the share of
completions that state an ``Answer: N`` at all, and a few sample completions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from areal_tasks.datasets.answers import extract_answer
from areal_tasks.datasets.registry import load_split
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.evaluation import eval_sampling, run_episodes, samples_per_prompt

if TYPE_CHECKING:
    from areal_tasks.api.scheduler import Scheduler
    from areal_tasks.api.workflow import RolloutWorkflow, Trajectory
    from areal_tasks.config.job import JobConfig
    from areal_tasks.inference.client import RemoteInferenceEngine

logger = logging.getLogger(__name__)

#: sample completions kept in the result.
N_SAMPLES = 4


async def _episodes(
    engine: RemoteInferenceEngine, workflow: RolloutWorkflow, records: list[Any], concurrency: int
) -> list[Trajectory | None]:
    try:
        return await run_episodes(engine, workflow, records, concurrency)
    finally:
        await engine.aclose()


def evaluate(
    cfg: JobConfig,
    model_dir: str,
    n_prompts: int | None = None,
    *,
    scheduler: Scheduler | None = None,
    name: str = "eval",
    n_samples: int | None = None,
) -> dict[str, Any]:
    """Reward and accuracy of ``model_dir`` on the first ``n_prompts`` eval prompts (see the module docstring).

    ``n_samples`` overrides :func:`samples_per_prompt` (samples of each prompt).
    """
    from areal_tasks.inference.launch.one_server import one_server
    from areal_tasks.models.tokenizer import load_tokenizer
    from areal_tasks.rollout.rewards import RewardRunner
    from areal_tasks.rollout.side import workflow_of

    if n_prompts is None:
        n_prompts = cfg.evaluation.max_eval_prompts
    if n_prompts is not None and n_prompts < 1:
        raise ConfigError(f"n_prompts={n_prompts} must be >= 1")
    per_prompt = samples_per_prompt(cfg) if n_samples is None else n_samples
    if per_prompt < 1:
        raise ConfigError(f"n_samples={n_samples} must be >= 1")
    records = load_split(cfg.dataset, "eval")[:n_prompts]
    if not records:
        raise ConfigError(f"dataset {cfg.dataset.path!r} has no eval prompts to evaluate on")
    episodes_in = [r for r in records for _ in range(per_prompt)]
    tokenizer = load_tokenizer(model_dir)
    reward = cfg.rollout.reward
    runner = RewardRunner(reward.fn, max_workers=reward.workers, timeout_s=reward.timeout_s)
    started = time.perf_counter()
    try:
        workflow = workflow_of(cfg, tokenizer, eval_sampling(cfg), runner.score)
        with one_server(cfg, model_dir, scheduler=scheduler, name=name) as served:
            trajectories = asyncio.run(
                _episodes(served.engine(), workflow, episodes_in, cfg.rollout.max_concurrent_rollouts)
            )
    finally:
        runner.close()
    rewards = [0.0 if t is None else float(t.reward) for t in trajectories]
    completions = [("" if t is None else str(t.metadata.get("completion", ""))) for t in trajectories]
    answered = sum(extract_answer(c) is not None for c in completions)
    result = {
        "model_dir": str(model_dir),
        "n_prompts": len(records),
        "n_samples": per_prompt,
        "n_episodes": len(rewards),
        "accuracy": sum(r >= 1.0 for r in rewards) / len(rewards),
        "mean_reward": sum(rewards) / len(rewards),
        "answer_rate": answered / len(completions),
        "wall_s": time.perf_counter() - started,
        "samples": [
            {
                "prompt": rec.prompt,
                "answer": rec.answer,
                "completion": completions[i * per_prompt],
                "reward": rewards[i * per_prompt],
            }
            for i, rec in enumerate(records[:N_SAMPLES])
        ],
    }
    logger.info(
        "eval %s: reward %.3f, accuracy %.3f over %d prompts x %d samples",
        model_dir,
        result["mean_reward"],
        result["accuracy"],
        len(records),
        per_prompt,
    )
    return result
