"""The step directories of a run with their status, each complete one checked: what ``list`` shows.

One damaged step never fails the listing: it is reported ``corrupt`` with the first damage found
(:func:`~areal_tasks.checkpoint.verify.verify_step`, cheap by default, deep on request). Torch-free
for the cheap check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from areal_tasks.checkpoint.layout import QUARANTINE_MARKER, CheckpointLayout
from areal_tasks.checkpoint.metadata import CheckpointMetadata, load_json
from areal_tasks.checkpoint.verify import verify_step
from areal_tasks.errors import CheckpointError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointInfo:
    """One step directory. ``status``: ``complete`` (a checkpoint that passed the check; carries its
    metadata), ``corrupt`` (marked complete but damaged: ``problem`` says the first damage found),
    ``quarantined`` (failed verification on resume; ``problem`` holds why; kept for inspection),
    ``data`` (pruned, but holding data that complete checkpoints reference) or ``partial`` (an
    interrupted save: ignored, removed by the next prune)."""

    step: int
    dir: str
    status: str
    metadata: CheckpointMetadata | None
    problem: str | None = None

    @property
    def complete(self) -> bool:
        return self.status == "complete"


def list_steps(layout: CheckpointLayout, *, deep: bool = False) -> list[CheckpointInfo]:
    """Every step directory of ``layout``, ascending, with its status (see :class:`CheckpointInfo`)."""
    dirs = layout.step_dirs()
    complete = set(layout.complete_steps())
    infos: dict[int, CheckpointInfo] = {}
    referenced: set[str] = set()
    for step in sorted(complete):
        try:
            report = verify_step(layout, step, deep=deep)
        except CheckpointError as exc:  # e.g. a metadata format this version cannot read
            infos[step] = CheckpointInfo(step, dirs[step], "corrupt", None, str(exc))
            continue
        if report.metadata is not None:
            referenced.update(report.metadata.references)
        problem = None if report.ok else str(report.problems[0])
        infos[step] = CheckpointInfo(step, dirs[step], "complete" if report.ok else "corrupt", report.metadata, problem)
    for step, name in dirs.items():
        if step in complete:
            continue
        files = layout.files(step)
        if not files:  # an emptied directory some S3 servers still list is skipped
            continue
        if QUARANTINE_MARKER in files:
            infos[step] = CheckpointInfo(step, name, "quarantined", None, _quarantine_reason(layout, step))
        else:
            infos[step] = CheckpointInfo(step, name, "data" if name in referenced else "partial", None)
    return [infos[step] for step in sorted(infos)]


def _quarantine_reason(layout: CheckpointLayout, step: int) -> str:
    key = layout.key(step, QUARANTINE_MARKER)
    try:
        record = load_json(layout.storage.read_bytes(key), layout.url(key))
    except CheckpointError as exc:
        return str(exc)
    return str(record.get("reason", "")) if isinstance(record, dict) else ""
