"""Taking training batches out of the rollout executor's ready groups (on its event loop).

:class:`BatchTaker` waits until :func:`~areal_tasks.rollout.staleness.select_batch` can return
``batch_size`` samples of whole groups: ordered by staleness deadline, then completion (with
``staleness_bound="admission"``: by completion only, never waiting for a running group). It counts
what it returns (consumed samples and batches, the staleness histogram, samples returned past their
group's deadline) and describes the last batch (:meth:`BatchTaker.last`). With ``data_order`` the
chosen groups are returned in data order (epoch, then place in the epoch) instead of completion
order, so a batch's layout does not depend on which episode finished first (the deterministic
rollout mode). The session trace learns which episodes went out, with their staleness. A timeout raises a
:class:`~areal_tasks.errors.RolloutError` that names the counters and the likely reason.
"""

from __future__ import annotations

import asyncio
import logging
import time

from areal_tasks.api.workflow import Trajectory
from areal_tasks.errors import RolloutError
from areal_tasks.rollout.groups import GroupAssembly
from areal_tasks.rollout.staleness import StalenessBound, select_batch
from areal_tasks.rollout.stats import StalenessHistogram, batch_stats, staleness_of

logger = logging.getLogger(__name__)

__all__ = ["BatchTaker"]


class BatchTaker:
    """Batches of ``batch_size`` samples from ``groups`` under ``bound`` (see the module docstring)."""

    def __init__(
        self, groups: GroupAssembly, *, batch_size: int, eta: int, bound: StalenessBound, data_order: bool = False
    ) -> None:
        self.groups = groups
        self.data_order = data_order
        self.batch_size = batch_size
        self.eta = eta
        self.bound: StalenessBound = bound
        self.groups_per_batch = batch_size // groups.group_size
        self.hist = StalenessHistogram()
        #: the last batch's numbers (empty before the first).
        self.last: dict[str, float] = {}
        #: ``"sample"`` batches returned although a remaining group would miss its deadline.
        self.late_batches = 0

    async def take(self, timeout_s: float | None) -> list[Trajectory]:
        """Wait for the next batch and return it, its groups whole and contiguous."""
        groups = self.groups
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    groups.raise_if_unusable()
                    changed = groups.changed()
                    chosen, on_time = select_batch(
                        groups.ready,
                        [g.deadline for g in groups.running.values()],
                        version=groups.version,
                        groups_per_batch=self.groups_per_batch,
                        bound=self.bound,
                    )
                    if chosen is not None:
                        break
                    await changed.wait()
        except TimeoutError:
            raise RolloutError(self.timeout_message(timeout_s)) from None
        groups.take(chosen)
        if self.data_order:
            chosen = sorted(chosen, key=lambda g: g.position)
        batch = [t for g in chosen for t in g.trajs if t is not None]
        version = groups.version
        staleness = [staleness_of(t, version) for t in batch]
        self.hist.add([s for s in staleness if s is not None])
        if groups.sessions is not None:
            sessions = [s for g in chosen for s, t in zip(g.sessions, g.trajs, strict=True) if t is not None]
            groups.sessions.handed(zip(sessions, staleness, strict=True), version)
        groups.counters.consumed_samples += len(batch)
        groups.counters.consumed_batches += 1
        late = sum(g.size for g in chosen if version > g.deadline)
        groups.counters.late_samples += late
        stats = batch_stats(batch, version=version, wait_s=time.monotonic() - started)
        stats["admit_staleness_max"] = float(max(version - g.admit_version for g in chosen))
        stats["late_samples"] = float(late)
        self.last = stats
        if not on_time:
            self.late_batches += 1
            logger.warning(
                "rollout batch at version %d leaves groups that will exceed max_head_offpolicyness=%d: the "
                "trainer version rose by more than one per batch",
                version,
                self.eta,
            )
        groups.admit()
        return batch

    def timeout_message(self, timeout_s: float | None) -> str:
        """Why no batch came within ``timeout_s``: the counters, the budget and a hint."""
        groups = self.groups
        counts = groups.counts()
        room, conc = groups.capacity()
        capacity = max(0, min(room, conc))
        text = (
            f"prepare_batch timed out after {timeout_s:g} s waiting for {self.batch_size} samples: "
            f"in flight={counts['in_flight']} episodes, ready={counts['ready']} samples, "
            f"admitted={groups.counters.admitted} samples so far, capacity={capacity} samples "
            f"(staleness budget room {room}, concurrency room {conc}); trainer version {groups.version} "
            f"(base {groups.base_version}), max_head_offpolicyness {self.eta}, "
            f"consumed {groups.counters.consumed_batches} batches, paused={groups.paused}"
        )
        if groups.paused:
            text += "; the executor is paused: call resume()"
        elif room < groups.group_size and counts["in_flight"] == 0:
            text += (
                "; the staleness budget is used up: call set_version() with the trainer's new version after "
                "each weight update (or raise rollout.max_head_offpolicyness)"
            )
        elif counts["in_flight"]:
            text += "; episodes are still generating: check the inference servers or raise timeout_s"
        return text
