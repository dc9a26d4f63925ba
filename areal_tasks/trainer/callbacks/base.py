"""The trainer's callback base: every hook the RL loop calls, each a no-op, and the list that calls them.

A side effect of the RL loop (logging, checkpointing, evaluation, the summary) is a
:class:`Callback` subclass that overrides the hooks it needs. Each rank's loop calls, on every
callback of its :class:`CallbackList` in list order:

=========================================  ===============================================================
``on_start(total_steps)``                  once, after recovery (state loaded, weights pushed), before the
                                           first step; ``total_steps`` is the steps this process will run
``on_step_metrics(step, metrics)``         a step is done: add to its metrics (the evaluation's) before
                                           anyone logs them; ``metrics`` is the step's dict, to update
``on_step(step, metrics)``                 log the step's metrics
``on_step_end(step, metrics)``             the step is logged: act on it (save a checkpoint), so a job
                                           killed after a save never skips logging a step
``on_train_end(summary)``                  the last step is done and the rollout side stopped: add to the
                                           run's ``summary`` dict (the final evaluation, the run's facts)
``on_end(summary)``                        the summary is complete: write it, log it, close up
``fail(reason)``                           the run failed (the loop re-raises the error after)
=========================================  ===============================================================

Two hooks are raised by callbacks, through the list they are in, for the others:
``on_eval(step, metrics, model_dir=None)`` after an evaluation (the evaluation callback) and
``on_checkpoint(step, url, metadata)`` once a checkpoint is complete (the checkpoint callback).
Torch-free, like every module of this package but the ones it names lazily.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["HOOKS", "Callback", "CallbackList"]

#: every hook of :class:`Callback`, in the order of the module docstring.
HOOKS = (
    "on_start",
    "on_step_metrics",
    "on_step",
    "on_step_end",
    "on_eval",
    "on_checkpoint",
    "on_train_end",
    "on_end",
    "fail",
)


class Callback:
    """A side effect of the RL loop: override the hooks you need (see the module docstring)."""

    def on_start(self, total_steps: int) -> None:
        """Before the first step (after recovery)."""

    def on_step_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Add to the metrics of ``step`` before they are logged."""

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log the metrics of ``step``."""

    def on_step_end(self, step: int, metrics: Mapping[str, float]) -> None:
        """After ``step`` is logged (checkpointing)."""

    def on_eval(self, step: int, metrics: Mapping[str, float], model_dir: str | None = None) -> None:
        """An evaluation at ``step`` gave ``metrics`` (of the model in ``model_dir``, when given)."""

    def on_checkpoint(self, step: int, url: str, metadata: Mapping[str, Any]) -> None:
        """The checkpoint of ``step`` is complete at ``url``."""

    def on_train_end(self, summary: dict[str, Any]) -> None:
        """The last step is done: add to the run's ``summary``."""

    def on_end(self, summary: Mapping[str, Any]) -> None:
        """The run's ``summary`` is complete."""

    def fail(self, reason: str) -> None:
        """The run failed with ``reason``; the loop re-raises the error after."""


class CallbackList(Callback):
    """Calls each hook on every callback, in list order (a failing hook stops the rest and raises)."""

    def __init__(self, callbacks: list[Callback] | None = None) -> None:
        self.callbacks = list(callbacks or [])

    def __iter__(self) -> Iterator[Callback]:
        return iter(self.callbacks)

    def __len__(self) -> int:
        return len(self.callbacks)

    def on_start(self, total_steps: int) -> None:
        for cb in self.callbacks:
            cb.on_start(total_steps)

    def on_step_metrics(self, step: int, metrics: dict[str, float]) -> None:
        for cb in self.callbacks:
            cb.on_step_metrics(step, metrics)

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        for cb in self.callbacks:
            cb.on_step(step, metrics)

    def on_step_end(self, step: int, metrics: Mapping[str, float]) -> None:
        for cb in self.callbacks:
            cb.on_step_end(step, metrics)

    def on_eval(self, step: int, metrics: Mapping[str, float], model_dir: str | None = None) -> None:
        for cb in self.callbacks:
            cb.on_eval(step, metrics, model_dir)

    def on_checkpoint(self, step: int, url: str, metadata: Mapping[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_checkpoint(step, url, metadata)

    def on_train_end(self, summary: dict[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_train_end(summary)

    def on_end(self, summary: Mapping[str, Any]) -> None:
        for cb in self.callbacks:
            cb.on_end(summary)

    def fail(self, reason: str) -> None:
        for cb in self.callbacks:
            cb.fail(reason)
