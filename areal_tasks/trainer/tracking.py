"""The trainer callbacks a job's ``tracking`` section asks for.

:func:`callbacks_from_config` builds the rank-0 callback list of the RL loop: the console progress
bar, the per-step JSONL file ``<run_dir>/rl_metrics.jsonl`` (``tracking.jsonl``) and, when
``tracking.mlflow_uri`` is set, an :class:`~areal_tasks.trainer.callbacks.mlflow.MLflowCallback`.

Importing this module does not import mlflow: the MLflow callback is imported only when a config
asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import RunPaths
from areal_tasks.trainer.callbacks import ConsoleProgress, JsonlMetrics

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

__all__ = ["callbacks_from_config"]


def callbacks_from_config(cfg: JobConfig, run_dir: Path, *, console: bool = True) -> list[Any]:
    """The callbacks for ``cfg``: console bar (when ``console``), JSONL metrics, MLflow.

    ``run_dir`` is where ``rl_metrics.jsonl`` goes (normally ``cfg.experiment.run_dir``). The
    MLflow callback logs to experiment ``tracking.mlflow_experiment`` (default
    ``experiment.name``; created with ``tracking.mlflow_artifact_location`` when missing), run name
    ``experiment.trial``, every ``tracking.log_every`` steps; it
    attaches to the run in ``$AREAL_MLFLOW_RUN_ID`` when that is set.
    """
    callbacks: list[Any] = []
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
