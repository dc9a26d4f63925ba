"""Trainer callbacks: where the metrics of every RL step go.

A callback gets ``on_start(total_steps)``, ``on_step(step, metrics)`` after each step and
``on_end(summary)`` once. Built in: :class:`ConsoleProgress` (a progress bar with step, reward, KL,
staleness and tokens/s) and :class:`JsonlMetrics` (one JSON object per step in a file). The MLflow
callback of the orchestration layer implements the same three methods.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

logger = logging.getLogger(__name__)


class Callback(Protocol):
    """What the RL loop calls on rank 0."""

    def on_start(self, total_steps: int) -> None: ...

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def on_end(self, summary: Mapping[str, Any]) -> None: ...


class ConsoleProgress:
    """A tqdm bar over the RL steps, its postfix the headline figures of the last step."""

    #: metric -> short label shown on the bar.
    SHOWN: ClassVar[dict[str, str]] = {
        "reward/mean": "reward",
        "actor/kl_ref": "kl",
        "actor/approx_kl": "approx_kl",
        "staleness/mean": "stale",
        "perf/tokens_per_s": "tok/s",
        "eval/reward": "eval",
    }

    def __init__(self, desc: str = "rl") -> None:
        self.desc = desc
        self._bar: Any = None
        self._last_eval: float | None = None

    def on_start(self, total_steps: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total_steps, desc=self.desc, dynamic_ncols=True)

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._bar is None:
            return
        if "eval/reward" in metrics:
            self._last_eval = metrics["eval/reward"]
        shown = {label: _short(metrics[key]) for key, label in self.SHOWN.items() if key in metrics}
        if self._last_eval is not None:
            shown["eval"] = _short(self._last_eval)
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)

    def on_end(self, summary: Mapping[str, Any]) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class JsonlMetrics:
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


def _short(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
