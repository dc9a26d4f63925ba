"""The rollout executor's prompt order: a seeded permutation per epoch, cycling, with a resumable position.

Epoch ``e`` visits the dataset in the order of ``random.Random(seed * 1_000_003 + e)``'s shuffle of
``range(len(dataset))`` (or in dataset order when ``shuffle`` is off). A position is
``(epoch, index)``: the ``index``-th prompt of epoch ``epoch``'s permutation. The source also keeps
a replay queue: positions that were handed out but never consumed (groups in flight or waiting when
a checkpoint was taken) are handed out again first after a resume, so no prompt is skipped.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["DataSource", "Position"]

#: ``(epoch, index within that epoch's permutation)``.
Position = tuple[int, int]


class DataSource:
    """Hands out ``(position, item)`` pairs of ``dataset`` forever, epoch after epoch."""

    def __init__(self, dataset: Sequence[Any], *, seed: int, shuffle: bool = True) -> None:
        if len(dataset) == 0:
            raise ConfigError("the rollout dataset is empty; the executor needs at least one prompt")
        self.dataset = dataset
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.index = 0
        self._replay: deque[Position] = deque()
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        """Dataset indices in the order epoch ``epoch`` visits them."""
        if epoch not in self._orders:
            order = list(range(len(self.dataset)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            if len(self._orders) >= 4:  # only the current epoch and a replayed one or two are ever asked for
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = order
        return self._orders[epoch]

    def dataset_index(self, position: Position) -> int:
        """The index in the dataset of the item at ``position``."""
        epoch, index = position
        return self.order(epoch)[index]

    def item_at(self, position: Position) -> Any:
        """The dataset item at ``position``."""
        return self.dataset[self.dataset_index(position)]

    def next(self) -> tuple[Position, Any]:
        """The next position (replayed ones first) and its item."""
        if self._replay:
            position = self._replay.popleft()
        else:
            position = (self.epoch, self.index)
            self.index += 1
            if self.index >= len(self.dataset):
                self.epoch, self.index = self.epoch + 1, 0
        return position, self.item_at(position)

    def state_dict(self, pending: Iterable[Position] = ()) -> dict[str, Any]:
        """JSON-safe position; ``pending`` are handed-out positions to replay first after a resume."""
        replay = [list(p) for p in self._replay]
        return {
            "epoch": self.epoch,
            "index": self.index,
            "pending": [list(p) for p in pending] + replay,
            "dataset_size": len(self.dataset),
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` output (pending positions first)."""
        if state.get("streaming"):
            raise ConfigError(
                "the rollout state was saved for a streamed dataset (dataset.streaming) and this job loads it; "
                "resume with the setting the run started with"
            )
        size = state.get("dataset_size", len(self.dataset))
        if size != len(self.dataset):
            raise ConfigError(
                f"the rollout state was saved for a dataset of {size} prompts, this one has {len(self.dataset)}; "
                "positions would point at other prompts (resume with the same dataset)"
            )
        if state.get("seed", self.seed) != self.seed or state.get("shuffle", self.shuffle) != self.shuffle:
            logger.warning(
                "rollout state was saved with seed=%s shuffle=%s, now seed=%s shuffle=%s: the prompt order changes",
                state.get("seed"),
                state.get("shuffle"),
                self.seed,
                self.shuffle,
            )
        epoch, index = int(state["epoch"]), int(state["index"])
        if epoch < 0 or not 0 <= index < len(self.dataset):
            raise ConfigError(f"invalid rollout data position epoch={epoch} index={index}")
        self.epoch, self.index = epoch, index
        self._replay = deque((int(e), int(i)) for e, i in state.get("pending", []))
