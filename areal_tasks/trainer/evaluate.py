"""Evaluate a model on the eval split through ONE inference server, as the trainer does.

``evaluate(cfg, model_dir, n_prompts)`` runs the evaluation harness
(:func:`areal_tasks.evaluation.harness.run_eval`: one server of the job's ``rollout.backend``) on
the config's eval split with the trainer's evaluation settings, so that it measures exactly what
the RL loop's own evaluation (:meth:`areal_tasks.rollout.side.RolloutSide.evaluate`,
``reward_before`` / ``reward_after``) measures and a checkpoint's number here can be compared
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
completions that state an answer at all, a few sample completions and the harness's whole summary.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError
from areal_tasks.rollout.evaluation import samples_per_prompt

if TYPE_CHECKING:
    from areal_tasks.api.scheduler import Scheduler
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

#: sample completions kept in the result.
N_SAMPLES = 4


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
    from areal_tasks.evaluation.harness import EvalOptions, run_eval
    from areal_tasks.evaluation.report import first_samples

    if n_prompts is None:
        n_prompts = cfg.evaluation.max_eval_prompts
    if n_prompts is not None and n_prompts < 1:
        raise ConfigError(f"n_prompts={n_prompts} must be >= 1")
    per_prompt = samples_per_prompt(cfg) if n_samples is None else n_samples
    if per_prompt < 1:
        raise ConfigError(f"n_samples={n_samples} must be >= 1")
    options = EvalOptions(n_samples=per_prompt, max_items=n_prompts)
    run = run_eval(cfg, model_dir, (), options, scheduler=scheduler, name=name, progress=False)
    summary = run.summary
    result = {
        "model_dir": str(model_dir),
        "n_prompts": summary["n_items"],
        "n_samples": per_prompt,
        "n_episodes": summary["n_samples"],
        # every item has per_prompt samples, so the mean of per-item pass@1 is the share of correct episodes
        "accuracy": summary["pass@1"],
        "mean_reward": summary["mean_reward"],
        "answer_rate": summary["answer_rate"],
        "wall_s": summary["wall_s"],
        "samples": first_samples(run, N_SAMPLES),
        "report": summary,
    }
    logger.info(
        "eval %s: reward %.3f, accuracy %.3f over %d prompts x %d samples",
        model_dir,
        result["mean_reward"],
        result["accuracy"],
        result["n_prompts"],
        per_prompt,
    )
    return result
