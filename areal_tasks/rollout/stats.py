"""The rollout executor's counters, staleness histogram and per-batch statistics (JSON-safe).

Counters are in samples (one sample = one episode = one ``arun_episode`` call), so they add up:
``admitted = accepted + rejected + filtered + running`` (plus the groups cancelled by ``stop()`` or
by a failure of the executor). ``failed`` episodes are a part of ``rejected``: a group with a failed
or rejected episode is rejected whole, its unfinished siblings are cancelled and counted with it.
``consumed_samples`` are the accepted samples already returned by ``prepare_batch``; ``late_samples``
are a part of them: those returned after their group's staleness deadline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from areal_tasks.api.workflow import Trajectory

__all__ = ["RolloutCounters", "StalenessHistogram", "batch_stats", "staleness_of"]


@dataclass
class RolloutCounters:
    """Monotone sample counters of one rollout run (they survive a checkpoint resume)."""

    #: samples started (group_size per admitted group).
    admitted: int = 0
    #: samples of groups that finished whole and passed the group filter.
    accepted: int = 0
    #: samples of groups dropped because an episode returned None, raised or was invalid.
    rejected: int = 0
    #: samples of groups dropped by the group filter (DAPO's dynamic filter).
    filtered: int = 0
    #: episodes that raised (or returned an invalid Trajectory); their groups are in ``rejected``.
    failed: int = 0
    #: accepted samples returned by ``prepare_batch``.
    consumed_samples: int = 0
    #: batches returned by ``prepare_batch``.
    consumed_batches: int = 0
    #: consumed samples whose group was returned after its deadline (admission version + eta), i.e.
    #: staler than ``max_head_offpolicyness`` by admission version: long-tail groups under
    #: ``staleness_bound="admission"``; under ``"sample"`` only when the trainer version rose by more
    #: than one per batch (``late_batches``). Missing from older states: loads as 0.
    late_samples: int = 0

    def to_dict(self) -> dict[str, int]:
        """JSON-safe copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutCounters:
        """Rebuild from :meth:`to_dict` output (unknown keys are ignored, missing ones are 0)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


class StalenessHistogram:
    """How many consumed samples had each staleness (trainer version at return - oldest token version)."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()

    def add(self, values: Sequence[int]) -> None:
        """Count the staleness of the samples of one batch."""
        self.counts.update(values)

    def as_dict(self) -> dict[int, int]:
        """``{staleness: samples}``, sorted by staleness."""
        return dict(sorted(self.counts.items()))

    def to_state(self) -> dict[str, int]:
        """JSON-safe (string keys)."""
        return {str(k): v for k, v in sorted(self.counts.items())}

    def load_state(self, data: dict[str, Any]) -> None:
        """Restore :meth:`to_state` output."""
        self.counts = Counter({int(k): int(v) for k, v in data.items()})


def staleness_of(traj: Trajectory, version: int) -> int | None:
    """``version - traj.oldest_version()``; None when the trajectory generated nothing."""
    oldest = traj.oldest_version()
    return None if oldest is None else version - oldest


def batch_stats(batch: Sequence[Trajectory], *, version: int, wait_s: float) -> dict[str, float]:
    """Numbers describing one returned batch (all floats, for metric sinks)."""
    staleness = [s for s in (staleness_of(t, version) for t in batch) if s is not None]
    rewards = [float(t.reward) for t in batch]
    generated = [t.n_generated for t in batch]
    return {
        "version": float(version),
        "n_samples": float(len(batch)),
        "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "staleness_max": float(max(staleness)) if staleness else 0.0,
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "generated_tokens_mean": sum(generated) / len(generated) if generated else 0.0,
        "wait_s": float(wait_s),
    }
