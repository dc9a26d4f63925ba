"""Trainer callbacks: the RL loop's side effects, one module each.

:mod:`.base` holds :class:`Callback` (every hook the loop calls, each a no-op, and the order it
calls them in) and :class:`CallbackList`. Loggers: :class:`ConsoleProgress` (a progress bar),
:class:`JsonlMetrics` (one JSON object per step), ``mlflow.MLflowCallback`` (an MLflow run; the
only module that imports mlflow, imported only when a config asks for it). The run's own side
effects: ``evaluation.EvaluationCallback``, ``checkpoint.CheckpointCallback``,
``summary.SummaryCallback``. ``trainer/tracking.py`` builds a job's list.
"""

from areal_tasks.trainer.callbacks.base import HOOKS, Callback, CallbackList
from areal_tasks.trainer.callbacks.console import ConsoleProgress
from areal_tasks.trainer.callbacks.jsonl import JsonlMetrics

__all__ = ["HOOKS", "Callback", "CallbackList", "ConsoleProgress", "JsonlMetrics"]
