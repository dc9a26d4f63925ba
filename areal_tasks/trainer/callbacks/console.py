"""Console progress: a tqdm bar over the RL steps with the headline figures of the last step.

The bar's postfix shows reward, KL, staleness, tokens/s and the last evaluation's reward; the
controller relays the bar from rank 0's log to its own terminal (``trainer/progress_relay.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from areal_tasks.trainer.callbacks.base import Callback

__all__ = ["ConsoleProgress"]


class ConsoleProgress(Callback):
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


def _short(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"
