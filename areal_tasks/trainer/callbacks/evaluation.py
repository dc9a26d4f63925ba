"""Evaluation callback: the starting policy, every ``evaluation.freq_steps`` steps, and the final policy.

On rank 0 (it holds the rollout side), through the same servers and workflow as training
(``RolloutSide.evaluate``: ``evaluation.n_samples`` samples per prompt at ``evaluation.temperature``,
and greedy decoding):

- ``on_start``: the starting policy, sampled and greedy (the summary's ``*_before``);
- ``on_step_metrics``: every ``evaluation.freq_steps`` steps but the last, the ``eval/...`` metrics
  join the step's metrics, so every logger sees them with the step, and ``on_eval`` is raised;
- ``on_train_end`` (the rollout side has stopped generating for training): the final policy,
  sampled and greedy; ``on_eval`` is raised at the last step and the summary gets the before/after
  rewards and accuracies and the evaluation settings.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.trace import span
from areal_tasks.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from areal_tasks.trainer.rl_run import RLRun

logger = logging.getLogger(__name__)

__all__ = ["EvaluationCallback"]


class EvaluationCallback(Callback):
    """Evaluates ``run``'s policy through its rollout side (rank 0; see the module docstring)."""

    def __init__(self, run: RLRun) -> None:
        if run.side is None:
            raise ValueError("the evaluation callback needs the rollout side (rank 0)")
        self.run = run
        self.side = run.side
        #: the starting policy's metrics (after ``on_start``).
        self.before: dict[str, float] = {}

    def on_start(self, total_steps: int) -> None:
        self.before = self._evaluate_both()
        logger.info(
            "starting policy: eval reward %.3f, accuracy %.3f", self.before["eval/reward"], self.before["eval/accuracy"]
        )

    def on_step_metrics(self, step: int, metrics: dict[str, float]) -> None:
        freq = self.run.cfg.evaluation.freq_steps
        if freq and step % freq == 0 and step != self.run.n_steps:
            with span("evaluation", "eval", greedy=False):
                evaluated = self.side.evaluate()
            metrics.update(evaluated)
            self.run.callbacks.on_eval(step, evaluated, None)

    def on_train_end(self, summary: dict[str, Any]) -> None:
        from areal_tasks.rollout.evaluation import samples_per_prompt

        after = self._evaluate_both()
        self.run.callbacks.on_eval(self.run.n_steps, after, None)
        before = self.before
        summary.update(
            {
                "reward_before": before["eval/reward"],
                "reward_after": after["eval/reward"],
                "accuracy_before": before["eval/accuracy"],
                "accuracy_after": after["eval/accuracy"],
                "greedy_accuracy_before": before["eval_greedy/accuracy"],
                "greedy_accuracy_after": after["eval_greedy/accuracy"],
                "eval_temperature": self.run.cfg.evaluation.temperature,
                "eval_samples_per_prompt": samples_per_prompt(self.run.cfg),
                "eval_prompts": int(after["eval_greedy/n"]),
            }
        )

    def _evaluate_both(self) -> dict[str, float]:
        with span("evaluation", "eval", greedy=False):
            sampled = self.side.evaluate()
        with span("evaluation", "eval", greedy=True):
            return {**sampled, **self.side.evaluate(greedy=True)}
