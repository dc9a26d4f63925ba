"""Incremental checkpoints: reuse the bytes of items that did not change since the parent checkpoint.

Every item (a tensor shard, or a serialised object) of a checkpoint has a sha256 in the DCP index.
When a new save finds an item with the same name, shard offset, hash, dtype and shape in its
parent, it records the parent's location of those bytes instead of writing them (a frozen base
model under LoRA, frozen embeddings, an unchanged scheduler state). The parent's record already
points at wherever the bytes physically are, so references never chain: loading reads each item
from one place, and a checkpoint's ``references`` (directory -> files) is exactly what pruning
must keep for it (see :mod:`areal_tasks.checkpoint.retention`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from areal_tasks.checkpoint.dcp_index import ItemKey, ItemRecord, records_of

if TYPE_CHECKING:
    from storage import Storage

logger = logging.getLogger(__name__)


class ParentIndex:
    """The item records of a parent checkpoint, looked up by (name, shard offset)."""

    def __init__(self, step_dir: str, records: Iterable[ItemRecord]) -> None:
        self.step_dir = step_dir
        self.records: dict[ItemKey, ItemRecord] = {r.key: r for r in records}

    @classmethod
    def load(cls, checkpoints: Storage, step_dir: str) -> ParentIndex:
        from areal_tasks.checkpoint.dcp_read import read_index

        return cls(step_dir, records_of(read_index(checkpoints, step_dir)))

    def match(
        self,
        fqn: str,
        offset: tuple[int, ...] | None,
        sha256: str,
        length: int,
        dtype: str | None,
        shape: tuple[int, ...] | None,
    ) -> ItemRecord | None:
        """The parent's record of identical content for this item, or None (then it must be written)."""
        found = self.records.get((fqn, offset))
        if found is None or found.sha256 != sha256 or found.length != length:
            return None
        if found.dtype != dtype or found.shape != shape:
            return None
        return found


def references_of(records: Iterable[ItemRecord], own_dir: str) -> dict[str, list[str]]:
    """Directory -> files of other step directories that ``records`` read (what pruning must keep)."""
    out: dict[str, set[str]] = {}
    for record in records:
        if record.dir != own_dir:
            out.setdefault(record.dir, set()).add(record.file)
    return {directory: sorted(files) for directory, files in sorted(out.items())}
