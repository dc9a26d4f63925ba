"""The RL loop's callbacks for a job: its own side effects and the loggers its ``tracking`` section asks for.

:func:`callbacks_from_config` builds the list. The loggers (rank 0): the console progress bar, the
per-step JSONL file ``<run_dir>/rl_metrics.jsonl`` (``tracking.jsonl``) and, when
``tracking.mlflow_uri`` is set, an :class:`~areal_tasks.trainer.callbacks.mlflow.MLflowCallback`.
Given the rank's run, the run's own side effects go around them: evaluation and the summary (rank
0), checkpointing (every rank).

Importing this module does not import mlflow (nor torch): the MLflow callback is imported only when
a config asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.trainer.callbacks import Callback, ConsoleProgress, JsonlMetrics

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.trainer.rl_run import RLRun

__all__ = ["callbacks_from_config"]


def callbacks_from_config(
    cfg: JobConfig,
    run_dir: Path,
    *,
    console: bool = True,
    run: RLRun | None = None,
    loggers: list[Callback] | None = None,
) -> list[Callback]:
    """The callbacks for ``cfg``, in the order the loop calls them.

    Without ``run``: the loggers, console bar (when ``console``), JSONL metrics, MLflow. ``run_dir``
    is where ``rl_metrics.jsonl`` goes (normally ``cfg.experiment.run_dir``). The MLflow callback
    logs to experiment ``tracking.mlflow_experiment`` (default ``experiment.name``; created with
    ``tracking.mlflow_artifact_location`` when missing), run name ``experiment.trial``, every
    ``tracking.log_every`` steps; it attaches to the run in ``$AREAL_MLFLOW_RUN_ID`` when that is set.

    With ``run`` (the rank's :class:`~areal_tasks.trainer.rl_run.RLRun`): on rank 0, evaluation and
    the summary first (the evaluation's metrics join a step's before a logger sees them, its figures
    come first in the summary, ``rl_summary.json`` is written before the loggers' ``on_end``), then the
    loggers (``loggers`` instead of the config's, when given), then checkpointing, on every rank
    (last: it closes the checkpoint manager after the loggers' ``on_end``).
    """
    if run is not None:
        from areal_tasks.trainer.callbacks.checkpoint import CheckpointCallback
        from areal_tasks.trainer.callbacks.evaluation import EvaluationCallback
        from areal_tasks.trainer.callbacks.summary import SummaryCallback

        if not run.is_main:
            return [CheckpointCallback(run)]
        chosen = loggers if loggers is not None else callbacks_from_config(cfg, run_dir, console=console)
        return [EvaluationCallback(run), SummaryCallback(run), *chosen, CheckpointCallback(run)]
    callbacks: list[Callback] = []
    if console:
        callbacks.append(ConsoleProgress())
    if cfg.tracking.jsonl:
        callbacks.append(JsonlMetrics(RunPaths.of(run_dir).rl_metrics))
    if cfg.tracking.mlflow_uri:
        from areal_tasks.trainer.callbacks.mlflow import MLflowCallback

        callbacks.append(
            MLflowCallback(
                cfg.tracking.mlflow_uri,
                cfg.tracking.mlflow_experiment or cfg.experiment.name,
                run_name=cfg.experiment.trial,
                config=cfg,
                log_every=cfg.tracking.log_every,
                artifact_location=cfg.tracking.mlflow_artifact_location,
            )
        )
    return callbacks
