"""A streamed data set (``dataset.streaming: true``): records read epoch by epoch, never all in memory.

:class:`RecordStream` wraps a ``datasets.IterableDataset`` and the column mapping. :meth:`~RecordStream.epoch`
yields the records of one pass: with ``shuffle``, the shard order and a buffer of
:data:`SHUFFLE_BUFFER` rows are shuffled by ``seed`` and the epoch (``datasets``' approximate
shuffle: the only kind a stream allows); rows whose prompt is too long (``keep`` returns False) are
dropped and counted, and the count is logged at the end of each pass.

Resuming a pass part-way: without shuffle, from ``datasets``' own ``state_dict`` (it seeks to the
shard and row, reading nothing twice); with shuffle, by drawing the same pass again and skipping the
records already handed out (the order is a function of seed and epoch, so the continuation is
exact; the cost is reading that part of the pass once more). :func:`record_to_json` /
:func:`record_from_json` carry records handed out but not yet trained on in a checkpoint (their
images as base64 PNG text).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from areal_tasks.datasets.columns import RecordMapper
from areal_tasks.datasets.images import to_image
from areal_tasks.datasets.registry import Record
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["SHUFFLE_BUFFER", "RecordStream", "record_from_json", "record_to_json"]

#: rows a shuffled stream draws at random from (``IterableDataset.shuffle(buffer_size=...)``).
SHUFFLE_BUFFER = 1000


def record_to_json(record: Record) -> dict[str, Any]:
    """A JSON-safe dict of ``record`` (for checkpoints; images as base64 PNG text)."""
    from areal_tasks.models.vision_processor import encode_image

    data = dataclasses.asdict(dataclasses.replace(record, images=()))
    data["images"] = [encode_image(image) for image in record.images]
    return data


def record_from_json(data: Mapping[str, Any]) -> Record:
    """The record :func:`record_to_json` wrote."""
    messages = data.get("messages")
    return Record(
        prompt=data["prompt"],
        answer=data["answer"],
        tools=tuple(data.get("tools") or ()),
        messages=None if messages is None else tuple(messages),
        tests=data.get("tests"),
        metadata=data.get("metadata"),
        images=tuple(
            to_image(base64.b64decode(text), f"checkpointed record image {i + 1}")
            for i, text in enumerate(data.get("images") or ())
        ),
    )


class RecordStream:
    """The records of a ``datasets.IterableDataset`` (see the module docstring)."""

    def __init__(
        self,
        dataset: Any,
        mapper: RecordMapper,
        *,
        source: str,
        keep: Callable[[Record], bool] | None = None,
    ) -> None:
        self.dataset = dataset
        self.mapper = mapper
        self.source = source
        #: False for a record to drop (a prompt over ``dataset.max_prompt_len``); None keeps all.
        self.keep = keep
        columns = getattr(dataset, "column_names", None)
        if columns:
            mapper.check_columns(columns)
        self._current: Any = None

    def with_filter(self, keep: Callable[[Record], bool] | None) -> RecordStream:
        """The same stream with another ``keep`` filter."""
        return RecordStream(self.dataset, self.mapper, source=self.source, keep=keep)

    def _pass(self, epoch: int, seed: int, shuffle: bool) -> Any:
        """A fresh view of the set for one pass (a loaded position must not stick to the next pass)."""
        if shuffle:
            ds = self.dataset.shuffle(seed=seed, buffer_size=SHUFFLE_BUFFER)
            ds.set_epoch(epoch)
            return ds
        return copy.deepcopy(self.dataset)

    def epoch(
        self, epoch: int, *, seed: int, shuffle: bool, skip: int = 0, hf_state: dict[str, Any] | None = None
    ) -> Iterator[Record]:
        """The records of pass ``epoch``, after the first ``skip`` (or from ``hf_state``, unshuffled)."""
        ds = self._pass(epoch, seed, shuffle)
        if hf_state is not None and not shuffle:
            ds.load_state_dict(hf_state)
            skip = 0
        self._current = ds
        kept = dropped = rows = 0
        for row in ds:
            rows += 1
            record = self.mapper.record(row, f"row {rows} of pass {epoch}")
            if self.keep is not None and not self.keep(record):
                dropped += 1
                continue
            kept += 1
            if kept > skip:
                yield record
        if dropped:
            logger.info(
                "%s: dropped %d of %d prompts in pass %d (longer than dataset.max_prompt_len)",
                self.source,
                dropped,
                rows,
                epoch,
            )
        if kept == 0 and hf_state is None:
            raise ConfigError(f"dataset {self.source!r} streams no records (empty, or every prompt too long)")

    def hf_state(self) -> dict[str, Any] | None:
        """``datasets``' position in the current pass (None before the first pass)."""
        return None if self._current is None else self._current.state_dict()
