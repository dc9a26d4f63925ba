"""The rollout executor's prompt order over a streamed data set (``dataset.streaming: true``).

:class:`StreamingDataSource` has :class:`~areal_tasks.rollout.data_source.DataSource`'s surface
(``next``, ``dataset_index``, ``item_at``, ``state_dict``, ``load_state_dict``) over a
:class:`~areal_tasks.datasets.stream.RecordStream`: pass after pass, each (seeded, approximately)
shuffled by :meth:`RecordStream.epoch`. A position is ``(epoch, index)``: the ``index``-th record
of that pass; its "dataset index" is that same ``index`` (a stream has no random access).

A stream cannot be asked for an item again, so the source remembers the items it handed out most
recently (:data:`REMEMBER` of them, far more than a rollout has in flight) and its state carries the
pending items themselves, not only their positions: after a resume they are handed out again first,
then the pass continues where it stopped (see :mod:`areal_tasks.datasets.stream` for how).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from areal_tasks.datasets.registry import Record
from areal_tasks.datasets.stream import RecordStream, record_from_json, record_to_json
from areal_tasks.errors import ConfigError, RolloutError
from areal_tasks.rollout.data_source import DataSource, Position

logger = logging.getLogger(__name__)

__all__ = ["REMEMBER", "StreamingDataSource", "data_source_for"]

#: handed-out items kept for replay (a checkpoint's pending groups are among the most recent).
REMEMBER = 16384


class StreamingDataSource:
    """Hands out ``(position, record)`` pairs of a stream forever, pass after pass."""

    def __init__(self, stream: RecordStream, *, seed: int, shuffle: bool = True) -> None:
        self.stream = stream
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.index = 0
        self._replay: deque[tuple[Position, Record]] = deque()
        self._recent: OrderedDict[Position, Record] = OrderedDict()
        self._iter: Iterator[Record] | None = None
        self._resume_hf: dict[str, Any] | None = None

    def dataset_index(self, position: Position) -> int:
        """The record's place in its pass (a stream has no other index)."""
        return position[1]

    def item_at(self, position: Position) -> Record:
        """A recently handed-out record (RolloutError if it is no longer remembered)."""
        try:
            return self._recent[position]
        except KeyError:
            raise RolloutError(
                f"the streamed record at {position} is no longer held (only the last {REMEMBER} are)"
            ) from None

    def _remember(self, position: Position, record: Record) -> None:
        self._recent[position] = record
        self._recent.move_to_end(position)
        while len(self._recent) > REMEMBER:
            self._recent.popitem(last=False)

    def _draw(self) -> Record:
        for _ in range(2):
            if self._iter is None:
                hf, self._resume_hf = self._resume_hf, None
                self._iter = self.stream.epoch(
                    self.epoch, seed=self.seed, shuffle=self.shuffle, skip=self.index, hf_state=hf
                )
            try:
                return next(self._iter)
            except StopIteration:
                self._iter = None
                if self.index == 0:
                    break
                self.epoch, self.index = self.epoch + 1, 0
        raise ConfigError(f"dataset {self.stream.source!r} streams no records (empty, or every prompt too long)")

    def next(self) -> tuple[Position, Record]:
        """The next position (replayed ones first) and its record."""
        if self._replay:
            position, record = self._replay.popleft()
        else:
            record = self._draw()
            position = (self.epoch, self.index)
            self.index += 1
        self._remember(position, record)
        return position, record

    def state_dict(self, pending: Iterable[Position] = ()) -> dict[str, Any]:
        """JSON-safe position plus the ``pending`` records (and those still to replay) themselves."""
        items = [(p, self.item_at(p)) for p in pending] + list(self._replay)
        hf = self._resume_hf if self._iter is None else self.stream.hf_state()
        return {
            "streaming": True,
            "epoch": self.epoch,
            "index": self.index,
            "pending": [list(p) for p, _ in items],
            "pending_items": [record_to_json(r) for _, r in items],
            "hf_state": hf if not self.shuffle else None,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output: pending records first, then the pass where it stopped."""
        if not state.get("streaming"):
            raise ConfigError(
                "the rollout state was saved for a loaded (map-style) dataset and this job streams it "
                "(dataset.streaming); resume with the setting the run started with"
            )
        if state.get("seed", self.seed) != self.seed or state.get("shuffle", self.shuffle) != self.shuffle:
            raise ConfigError(
                f"the rollout state was saved with seed={state.get('seed')} shuffle={state.get('shuffle')}, now "
                f"seed={self.seed} shuffle={self.shuffle}: a stream can only resume in the same order"
            )
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or index < 0:
            raise ConfigError(f"invalid rollout data position epoch={epoch} index={index}")
        positions = [(int(e), int(i)) for e, i in state.get("pending", [])]
        records = [record_from_json(r) for r in state.get("pending_items", [])]
        if len(positions) != len(records):
            raise ConfigError("the streamed rollout state holds pending positions without their records")
        self.epoch, self.index = epoch, index
        self._replay = deque(zip(positions, records, strict=True))
        self._iter = None
        self._resume_hf = state.get("hf_state")


def data_source_for(
    dataset: Sequence[Any] | RecordStream, *, seed: int, shuffle: bool = True
) -> DataSource | StreamingDataSource:
    """The executor's prompt order: a :class:`StreamingDataSource` for a stream, else a :class:`DataSource`."""
    if isinstance(dataset, RecordStream):
        return StreamingDataSource(dataset, seed=seed, shuffle=shuffle)
    return DataSource(dataset, seed=seed, shuffle=shuffle)
