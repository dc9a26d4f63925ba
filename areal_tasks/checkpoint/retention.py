"""Which checkpoints to keep, and pruning that never deletes data a kept checkpoint references.

Kept: the newest ``keep_last`` complete checkpoints, every one whose step is a multiple of
``keep_every``, and the one with the highest ``keep_best_metric`` (ties: the newer one). Every
other step directory goes: complete ones past retention and partial ones left by a killed save.
One exception: a directory holding data that a kept checkpoint references (incremental saves) is
*stripped* instead -- its ``_COMPLETE`` marker is removed first (so it stops being a checkpoint),
then every file that no kept checkpoint reads; the referenced data files stay until the last
checkpoint that reads them is pruned. Torch-free.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_tasks.checkpoint.layout import COMPLETE_MARKER, CheckpointLayout, step_dir
from areal_tasks.errors import CheckpointError

if TYPE_CHECKING:
    from areal_tasks.config.sections import SaverConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionPolicy:
    """What to keep (see the module docstring)."""

    keep_last: int = 2
    keep_every: int | None = None
    keep_best_metric: str | None = None

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise CheckpointError(
                f"saver.keep_last must be >= 1 (the newest checkpoint is always kept), got {self.keep_last}"
            )
        if self.keep_every is not None and self.keep_every < 1:
            raise CheckpointError(f"saver.keep_every must be >= 1 or None, got {self.keep_every}")

    @classmethod
    def from_saver(cls, saver: SaverConfig) -> RetentionPolicy:
        return cls(keep_last=saver.keep_last, keep_every=saver.keep_every, keep_best_metric=saver.keep_best_metric)


def select_kept(checkpoints: Mapping[int, Mapping[str, float]], policy: RetentionPolicy) -> dict[int, list[str]]:
    """``{step: reasons}`` of the complete checkpoints to keep; ``checkpoints`` maps step -> metrics."""
    steps = sorted(checkpoints)
    kept: dict[int, list[str]] = {}
    for step in steps[-policy.keep_last :]:
        kept.setdefault(step, []).append("last")
    if policy.keep_every is not None:
        for step in steps:
            if step % policy.keep_every == 0:
                kept.setdefault(step, []).append(f"every {policy.keep_every}")
    metric = policy.keep_best_metric
    if metric is not None:
        scored = [
            (float(checkpoints[step][metric]), step)
            for step in steps
            if metric in checkpoints[step] and math.isfinite(float(checkpoints[step][metric]))
        ]
        if scored:
            _, best = max(scored)
            kept.setdefault(best, []).append(f"best {metric}")
        elif steps:
            logger.warning("no checkpoint has a finite %r metric: keeping none for keep_best_metric", metric)
    return dict(sorted(kept.items()))


@dataclass
class PrunePlan:
    """What pruning does: ``delete`` whole directories, ``strip`` files of directories kept for data."""

    kept: dict[int, list[str]] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    strip: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kept": {str(k): v for k, v in self.kept.items()},
            "delete": list(self.delete),
            "strip": dict(self.strip),
        }


def plan_prune(
    directories: Mapping[str, Collection[str]],
    complete: Mapping[int, tuple[Mapping[str, float], Mapping[str, Collection[str]]]],
    policy: RetentionPolicy,
    protect: Collection[str] = (),
) -> PrunePlan:
    """The prune plan.

    ``directories``: every step directory name -> the files in it. ``complete``: step -> (metrics,
    references) of each complete checkpoint, references being directory -> files it reads.
    ``protect``: directory names never touched (a save in progress).
    """
    kept = select_kept({step: metrics for step, (metrics, _) in complete.items()}, policy)
    kept_dirs = {step_dir(step) for step in kept}
    needed: dict[str, set[str]] = {}
    for step in kept:
        for directory, files in complete[step][1].items():
            needed.setdefault(directory, set()).update(files)
    plan = PrunePlan(kept=kept)
    for directory, files in sorted(directories.items()):
        if directory in kept_dirs or directory in protect:
            continue
        if directory not in needed:
            plan.delete.append(directory)
            continue
        missing = needed[directory] - set(files)
        if missing:
            raise CheckpointError(f"kept checkpoints reference files missing from {directory}: {sorted(missing)}")
        extra = sorted(set(files) - needed[directory])
        if extra:
            # the marker goes first: from that moment on, readers no longer take the directory for a checkpoint
            plan.strip[directory] = sorted(extra, key=lambda name: name != COMPLETE_MARKER)
    return plan


def apply_prune(layout: CheckpointLayout, plan: PrunePlan) -> None:
    """Carry out ``plan`` on ``layout``'s storage (stripped directories lose their marker first)."""
    storage = layout.storage
    for directory, files in plan.strip.items():
        logger.info("pruning %s but keeping data that kept checkpoints reference", layout.url(directory))
        for name in files:
            storage.delete(f"{directory}/{name}", missing_ok=True)
    for directory in plan.delete:
        logger.info("pruning %s", layout.url(directory))
        storage.delete(directory, recursive=True, missing_ok=True)
