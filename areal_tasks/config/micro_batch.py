"""How a train engine splits a batch into micro-batches (torch-free; the engine imports it).

A batch is cut into at least ``n_mbs`` micro-batches, each holding at most ``max_tokens_per_mb``
tokens when that is set. Sequences are assigned by a bin-packing heuristic (``ffd``: first-fit
decreasing; ``kk``: Karmarkar-Karp balanced partition) in units of ``granularity`` consecutive
sequences, so a GRPO group never straddles two micro-batches.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass
class MicroBatchSpec:
    """Micro-batching of one train engine (``actor.micro_batch``, ``critic.micro_batch``, ...)."""

    #: minimum number of micro-batches per (mini-)batch.
    n_mbs: int = 1
    #: token cap per micro-batch (padding included); None = no cap, only ``n_mbs`` splits.
    max_tokens_per_mb: int | None = None
    #: packing heuristic: ``ffd`` (first-fit decreasing) or ``kk`` (Karmarkar-Karp balanced).
    packing: Literal["ffd", "kk"] = "ffd"
    #: consecutive sequences kept in the same micro-batch (e.g. a GRPO group of ``group_size``).
    granularity: int = 1
    #: pad every packed micro-batch to a multiple of this many tokens (e.g. the TP/SP degree).
    pad_to_multiple_of: int = 1
    #: when set, ``max_tokens_per_mb`` is sized automatically from the memory estimator to fit this budget.
    memory_budget_gb: float | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid field, as ``"<field>: <what is wrong>"`` (empty when the spec is valid)."""
        found: list[str] = []
        for name in ("n_mbs", "granularity", "pad_to_multiple_of"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                found.append(f"{name}: must be an integer >= 1, got {value!r}")
        cap = self.max_tokens_per_mb
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            found.append(f"max_tokens_per_mb: must be null or an integer >= 1, got {cap!r}")
        if self.packing not in ("ffd", "kk"):
            found.append(f"packing: must be 'ffd' or 'kk', got {self.packing!r}")
        budget = self.memory_budget_gb
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
            found.append(f"memory_budget_gb: must be null or a number > 0, got {budget!r}")
        return found
