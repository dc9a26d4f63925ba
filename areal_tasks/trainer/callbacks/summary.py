"""Summary callback: the run's facts in its summary and ``<run_dir>/rl_summary.json`` (rank 0).

It remembers the last step's metrics; ``on_train_end`` adds, after the evaluation's figures, the
steps run, the first step (after a recovery), the final version, the wall time, the last step's
metrics, the rollout executor's statistics and the layout each engine actually ran
(``engine_layout``); ``on_end`` writes the summary atomically to ``rl_summary.json``
(:class:`~areal_tasks.api.run_dir.RunPaths`), which the controller reads into ``summary.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from areal_tasks.trainer.rl_run import RLRun

__all__ = ["SummaryCallback"]


class SummaryCallback(Callback):
    """Completes and writes ``run``'s summary (see the module docstring)."""

    def __init__(self, run: RLRun) -> None:
        self.run = run
        self.last_step: Mapping[str, float] = {}

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        self.last_step = metrics

    def on_train_end(self, summary: dict[str, Any]) -> None:
        from areal_tasks.trainer.engines import engine_layout

        run = self.run
        summary.update(
            {
                "steps": run.n_steps,
                "first_step": run.first_step,
                "final_version": run.version,
                "wall_seconds": time.perf_counter() - run.started,
                "last_step": self.last_step,
                "executor": run.side.executor.stats() if run.side is not None else {},
                "engine_layout": engine_layout(run.engines),
            }
        )

    def on_end(self, summary: Mapping[str, Any]) -> None:
        from storage.atomic import write_local_text

        write_local_text(RunPaths.of(self.run.run_dir).rl_summary, json.dumps(summary, indent=2, default=float))
