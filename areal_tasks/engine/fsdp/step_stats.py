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
from collections.abc import Callable, Sequence
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

    def totals(self, device_values: list[float]) -> dict[str, float]:
        """The host sums plus ``device_values`` (the read-back of :attr:`device`, in its order)."""
        out = dict(self.host)
        for key, value in zip(self.device, device_values):
            out[key] = out.get(key, 0.0) + value
        return out


class HostCopy:
    """Device scalars on their way to the host: one stacked, non-blocking copy into pinned memory
    and an event recorded after it. :meth:`values` waits for that event only, not for whatever the
    stream queued later (a ``.tolist()`` would wait for all of it: the next step too)."""

    def __init__(self, scalars: Sequence[torch.Tensor]) -> None:
        import torch

        self._event: Any = None
        if not scalars:
            self._host = None
            return
        first = scalars[0].device
        stacked = torch.stack([t.detach().reshape(()).to(first, torch.float64) for t in scalars])
        if stacked.is_cuda:
            with torch.cuda.device(stacked.device):  # the copy and the event on that device's stream
                self._host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
                self._host.copy_(stacked, non_blocking=True)
                self._event = torch.cuda.Event()
                self._event.record()
        else:
            self._host = stacked

    def values(self) -> list[float]:
        if self._host is None:
            return []
        if self._event is not None:
            self._event.synchronize()
        return self._host.tolist()


class PendingStats:
    """A step's losses and stats, still on the device: :meth:`stage` starts their copy to the host
    (together with any other device scalars of the step) and :meth:`read` reads them back at once;
    either way they are averaged over the batch's loss weight, across dp ranks too."""

    def __init__(self, all_reduce: AllReduce, sums: WeightedSums, total_weight: float, n_tokens: float) -> None:
        self._all_reduce, self._sums = all_reduce, sums
        self._total_weight, self._n_tokens = total_weight, n_tokens

    def stage(self, extra: Sequence[torch.Tensor] = ()) -> StagedStats:
        """Queue the copy of the stats and of ``extra`` to the host; nothing waits yet."""
        device = list(self._sums.device.values())
        return StagedStats(self, HostCopy([*device, *extra]), len(device))

    def read(self) -> TrainStats:
        return self.stage().read()[0]

    def finish(self, device_values: list[float]) -> TrainStats:
        """The stats from the read-back of the device sums (in their order): averaged, dp-reduced."""
        totals = self._sums.totals(device_values)
        keys = sorted(totals)
        reduced = self._all_reduce([totals[k] for k in keys]) if keys else []
        result: TrainStats = {k: v / self._total_weight for k, v in zip(keys, reduced)}
        result["n_tokens"] = self._n_tokens
        return result


class StagedStats:
    """:class:`PendingStats` whose copy to the host is queued."""

    def __init__(self, pending: PendingStats, copy: HostCopy, n_stats: int) -> None:
        self._pending, self._copy, self._n_stats = pending, copy, n_stats

    def read(self) -> tuple[TrainStats, list[float]]:
        """(the stats, the ``extra`` values in their order): waits for the copy, then the dp all-reduce."""
        values = self._copy.values()
        return self._pending.finish(values[: self._n_stats]), values[self._n_stats :]


class QueuedStep(SubmittedStep):
    """An optimizer step whose kernels are queued: ``grad_norm`` is the step's global gradient norm
    (a device tensor when the update kernel decides on the device whether to skip, else the host
    value the engine already decided with). The copy of the stats and the norm to the host is
    queued right away; :meth:`result` waits for that copy only (not for steps queued after this
    one), once."""

    def __init__(self, stats: PendingStats, grad_norm: torch.Tensor | float, lr: float, *, skip_logged: bool) -> None:
        on_device = not isinstance(grad_norm, float)
        self._staged = stats.stage([grad_norm] if on_device else [])
        self._grad_norm = None if on_device else grad_norm
        self._lr, self._skip_logged = lr, skip_logged
        self._result: TrainStats | None = None

    def result(self) -> TrainStats:
        if self._result is None:
            stats, extra = self._staged.read()  # the step's read-back
            grad_norm = extra[0] if self._grad_norm is None else self._grad_norm
            stepped = math.isfinite(grad_norm)
            if not stepped and not self._skip_logged:
                logger.warning("non-finite gradient norm %s: optimizer step skipped", grad_norm)
            stats.update(lr=self._lr, grad_norm=grad_norm, update_skipped=0.0 if stepped else 1.0)
            self._result = stats
            self._staged = None  # type: ignore[assignment]  (drop the device tensors)
        return dict(self._result)
