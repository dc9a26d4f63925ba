"""A step's losses and stats while they are still on the device, and the handle of a submitted
optimizer step that reads them back.

The engine keeps every micro-batch's loss and stats on the device (:class:`WeightedSums`) and reads
them back once a step (:class:`PendingStats`). :class:`QueuedStep` is what
``FSDPEngine.submit_train_batch`` returns: the forward, backward and update kernels are all queued
and nothing has been read back yet, so a training loop can hand the engine its next batch while the
device still works on this one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from areal_tasks.api.train_engine import SubmittedStep, TrainStats
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: sums a list of host values over the data-parallel group (a collective when dp > 1).
AllReduce = Callable[[list[float]], list[float]]


class WeightedSums:
    """Weighted sums of per-micro-batch losses/stats: tensors stay on their device (no read-back per
    micro-batch), Python numbers on the host; :meth:`totals` reads everything back once."""

    def __init__(self) -> None:
        self.host: dict[str, float] = {}
        self.device: dict[str, Any] = {}

    def add(self, values: dict[str, Any], weight: float) -> None:
        import torch

        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise EngineError(f"loss/stat {key!r} must be a scalar, got a tensor of shape {tuple(value.shape)}")
                term = value.detach().reshape(()).to(torch.float64) * weight
                self.device[key] = term if key not in self.device else self.device[key] + term
            else:
                self.host[key] = self.host.get(key, 0.0) + float(value) * weight

    def totals(self) -> dict[str, float]:
        import torch

        out = dict(self.host)
        if self.device:
            keys = list(self.device)
            first = self.device[keys[0]].device
            values = torch.stack([self.device[k].to(first) for k in keys]).tolist()
            for key, value in zip(keys, values):
                out[key] = out.get(key, 0.0) + value
        return out


class PendingStats:
    """A step's losses and stats, still on the device: :meth:`read` reads them back (once, all
    together) and averages them over the batch's loss weight, across dp ranks too."""

    def __init__(self, all_reduce: AllReduce, sums: WeightedSums, total_weight: float, n_tokens: float) -> None:
        self._all_reduce, self._sums = all_reduce, sums
        self._total_weight, self._n_tokens = total_weight, n_tokens

    def read(self) -> TrainStats:
        totals = self._sums.totals()
        keys = sorted(totals)
        reduced = self._all_reduce([totals[k] for k in keys]) if keys else []
        result: TrainStats = {k: v / self._total_weight for k, v in zip(keys, reduced)}
        result["n_tokens"] = self._n_tokens
        return result


class QueuedStep(SubmittedStep):
    """An optimizer step whose kernels are queued: ``grad_norm`` is the step's global gradient norm
    (a device tensor when the update kernel decides on the device whether to skip, else the host
    value the engine already decided with). :meth:`result` reads the stats back, once."""

    def __init__(self, stats: PendingStats, grad_norm: torch.Tensor | float, lr: float, *,
                 skip_logged: bool) -> None:
        self._stats, self._grad_norm, self._lr = stats, grad_norm, lr
        self._skip_logged = skip_logged
        self._result: TrainStats | None = None

    def result(self) -> TrainStats:
        if self._result is None:
            stats = self._stats.read()  # the step's read-back
            grad_norm = float(self._grad_norm)
            stepped = math.isfinite(grad_norm)
            if not stepped and not self._skip_logged:
                logger.warning("non-finite gradient norm %s: optimizer step skipped", grad_norm)
            stats.update(lr=self._lr, grad_norm=grad_norm, update_skipped=0.0 if stepped else 1.0)
            self._result = stats
            self._stats = None  # type: ignore[assignment]  (drop the device tensors)
        return dict(self._result)
