"""JSONL metrics: one JSON object per RL step (``{"step": N, **metrics}``) appended to a file.

The file is ``<run_dir>/rl_metrics.jsonl`` in a job (``tracking.jsonl``); non-finite values become
null, so every line is valid JSON.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from areal_tasks.trainer.callbacks.base import Callback

logger = logging.getLogger(__name__)

__all__ = ["JsonlMetrics"]


class JsonlMetrics(Callback):
    """Appends ``{"step": N, **metrics}`` per step to ``path`` (non-finite values become null)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def on_start(self, total_steps: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        row = {"step": step, **{k: (v if math.isfinite(v) else None) for k, v in metrics.items()}}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")

    def on_end(self, summary: Mapping[str, Any]) -> None:
        logger.info("per-step metrics in %s", self.path)
