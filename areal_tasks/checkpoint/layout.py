"""Where checkpoints live: ``<root>/<experiment>/<trial>/checkpoints/step_<N>/``, markers and pointers.

A step directory holds the DCP data (``dcp/rank-*.distcp`` and ``dcp/index.json``), per-rank RNG
states (``rng/rank-*.json``), ``trainer_state.json``, ``engines.json``, HF sidecars
(``hf/<engine>/config.json`` and tokenizer files), ``metadata.json`` and, written after everything
else, the ``_COMPLETE`` marker. After the marker the ``latest`` pointer (next to the step
directories) is rewritten. Readers trust only directories that carry ``_COMPLETE``: a save killed
midway leaves a directory without it, which is ignored and later removed by pruning. A checkpoint
that fails verification on resume is *quarantined*: ``_QUARANTINED`` (the reason, and the marker's
content) replaces ``_COMPLETE``, so it is never picked again; pruning leaves it for inspection until
the run saves that step again.

Torch-free: the CLI and the retention logic use it without importing torch.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import posixpath
import re
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import CheckpointError

if TYPE_CHECKING:
    from storage import Storage

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
STEP_PREFIX = "step_"
COMPLETE_MARKER = "_COMPLETE"
QUARANTINE_MARKER = "_QUARANTINED"
LATEST_POINTER = "latest"
METADATA_FILE = "metadata.json"
TRAINER_STATE_FILE = "trainer_state.json"
ENGINES_FILE = "engines.json"
DCP_DIR = "dcp"
DCP_INDEX = "dcp/index.json"
RNG_DIR = "rng"
HF_DIR = "hf"

_STEP_RE = re.compile(r"^step_(\d+)$")


def utc_now() -> str:
    """The current time as ISO-8601 UTC (what every timestamp in a checkpoint uses)."""
    return dt.datetime.now(dt.timezone.utc).isoformat()


def checkpoints_key(experiment: str, trial: str) -> str:
    """The key of the checkpoints folder of a run below the storage root."""
    for label, value in (("experiment", experiment), ("trial", trial)):
        if not value or "/" in value or value in (".", ".."):
            raise CheckpointError(
                f"{label} name {value!r} cannot be a path component; use a non-empty name without '/'"
            )
    return f"{experiment}/{trial}/{CHECKPOINTS_DIR}"


def step_dir(step: int) -> str:
    """``step_<N>``: the directory name of the checkpoint of ``step``."""
    if step < 0:
        raise CheckpointError(f"checkpoint step must be >= 0, got {step}")
    return f"{STEP_PREFIX}{int(step)}"


def parse_step_dir(name: str) -> int | None:
    """The step of a ``step_<N>`` directory name; None for any other name."""
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank-{rank:05d}.json"


def dcp_data_file(rank: int) -> str:
    return f"{DCP_DIR}/rank-{rank:05d}.distcp"


class CheckpointLayout:
    """The checkpoints folder of one run, as a Storage rooted at that folder."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage

    @classmethod
    def for_run(cls, root: Storage, experiment: str, trial: str) -> CheckpointLayout:
        """The layout of ``<root>/<experiment>/<trial>/checkpoints``."""
        return cls(root.child(checkpoints_key(experiment, trial)))

    def url(self, key: str = "") -> str:
        return self.storage.url_for(key)

    def key(self, step: int, rel: str = "") -> str:
        """The key of ``rel`` inside the directory of ``step`` (the directory itself for ``rel=''``)."""
        return posixpath.join(step_dir(step), rel) if rel else step_dir(step)

    # -- listing ---------------------------------------------------------------------------------

    def step_dirs(self) -> dict[int, str]:
        """Every ``step_<N>`` directory, complete or not: step -> directory name (sorted by step)."""
        if not self.storage.exists():
            return {}
        found = {}
        for name in self.storage.list():
            step = parse_step_dir(name)
            if step is not None:
                found[step] = name
        return dict(sorted(found.items()))

    def files(self, step: int) -> dict[str, int]:
        """The files of the directory of ``step`` (relative key -> size); empty when it has none.

        A directory without files counts as absent: some S3 servers (SeaweedFS) keep listing an
        emptied prefix after every object below it was deleted.
        """
        key = self.key(step)
        return self.storage.walk_files(key) if self.storage.exists(key) else {}

    def is_complete(self, step: int) -> bool:
        return self.storage.exists(self.key(step, COMPLETE_MARKER))

    def complete_steps(self) -> list[int]:
        """Steps whose directory carries the ``_COMPLETE`` marker, ascending."""
        return [step for step in self.step_dirs() if self.is_complete(step)]

    # -- markers and the latest pointer ------------------------------------------------------------

    def write_complete(self, step: int, payload: dict[str, Any]) -> None:
        """Write the ``_COMPLETE`` marker of ``step`` (atomically; the last file of a save)."""
        self.storage.write_text(self.key(step, COMPLETE_MARKER), json.dumps(payload, indent=1, sort_keys=True))

    def quarantine(self, step: int, reason: str) -> None:
        """Take ``step`` out of the complete checkpoints: ``_QUARANTINED`` (``reason`` and the old
        marker's text) is written, then ``_COMPLETE`` removed. The files stay for inspection."""
        marker = self.key(step, COMPLETE_MARKER)
        previous = self.storage.read_text(marker) if self.storage.exists(marker) else None
        payload = {"reason": reason, "quarantined_at": utc_now(), "complete": previous}
        self.storage.write_text(self.key(step, QUARANTINE_MARKER), json.dumps(payload, indent=1, sort_keys=True))
        self.storage.delete(marker, missing_ok=True)
        logger.warning("quarantined checkpoint %s: %s", self.url(step_dir(step)), reason)

    def read_latest_pointer(self) -> int | None:
        """The step the ``latest`` pointer names, or None when there is no (readable) pointer."""
        if not self.storage.exists(LATEST_POINTER):
            return None
        text = self.storage.read_text(LATEST_POINTER)
        try:
            step = int(json.loads(text)["step"])
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            logger.warning(
                "ignoring the unreadable latest pointer %s (%s): %r", self.url(LATEST_POINTER), exc, text[:80]
            )
            return None
        return step

    def write_latest_pointer(self, step: int) -> None:
        payload = {"step": step, "dir": step_dir(step), "updated_at": utc_now()}
        self.storage.write_text(LATEST_POINTER, json.dumps(payload, sort_keys=True))

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, or None when there is none.

        The pointer is written after the marker, so a save killed between the two leaves a newer
        complete checkpoint than the pointer names: the newest complete one wins (with a warning).
        A pointer naming an incomplete or missing directory is ignored.
        """
        complete = self.complete_steps()
        pointer = self.read_latest_pointer()
        if not complete:
            if pointer is not None:
                logger.warning("latest pointer names step %d but %s holds no complete checkpoint", pointer, self.url())
            return None
        newest = complete[-1]
        if pointer != newest:
            logger.warning(
                "latest pointer of %s names %s; the newest complete checkpoint is step %d: using it",
                self.url(),
                "nothing" if pointer is None else f"step {pointer}",
                newest,
            )
        return newest
