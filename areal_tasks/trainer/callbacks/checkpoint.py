"""Checkpoint callback: a checkpoint every ``saver.freq_steps`` steps and at the last step, on every rank.

``on_step_end`` (after the step's metrics are logged: a job killed after a save resumes past that
step, so it must not skip logging it) saves every engine of the run and the trainer state (step,
version, the rollout executor's position, counters and the prompts in flight, from rank 0) through
the :class:`~areal_tasks.checkpoint.manager.CheckpointManager`, with the step's ``reward/`` and
``eval/`` metrics for retention. ``on_checkpoint`` is raised only for a save already complete (an
asynchronous save still writing is not announced). ``on_end`` closes the manager, waiting for a save
in flight. Every rank saves its shards, so every rank has this callback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from areal_tasks.trace import span
from areal_tasks.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from areal_tasks.trainer.rl_run import RLRun

__all__ = ["CheckpointCallback"]

#: metric prefixes recorded with a checkpoint (what retention may rank by).
RECORDED_METRICS = ("reward/", "eval/")


class CheckpointCallback(Callback):
    """Saves ``run``'s checkpoints (see the module docstring)."""

    def __init__(self, run: RLRun) -> None:
        self.run = run

    def on_step_end(self, step: int, metrics: Mapping[str, float]) -> None:
        from areal_tasks.checkpoint.layout import step_dir
        from areal_tasks.checkpoint.state import TrainerState

        run = self.run
        if not run.manager.should_save(step, last=step == run.n_steps):
            return
        with span("checkpoint save", "checkpoint", async_save=run.cfg.saver.async_save):
            executor_state = run.side.executor.state_dict() if run.side is not None else {}
            ticket = run.manager.save(
                step,
                run.engines,
                TrainerState(step=step, version=run.version, executor=executor_state),
                {k: v for k, v in metrics.items() if k.startswith(RECORDED_METRICS)},
                config=run.cfg,
            )
        if ticket.done():
            run.callbacks.on_checkpoint(step, run.manager.layout.url(step_dir(step)), ticket.wait().to_dict())

    def on_end(self, summary: Mapping[str, Any]) -> None:
        self.run.manager.close()
