"""A padded row layout for grouped GEMMs over tokens sorted by expert (``torch._grouped_mm``).

A dispatcher hands the expert compute rows sorted by local expert with their per-expert counts
(host integers). A grouped GEMM on CUDA wants every group to start at an aligned row: bf16 needs
16-byte aligned group starts, i.e. a multiple of 8 rows, and its ``offs`` argument is the int32
cumulative end of each group. :func:`grouped_layout` pads each group's row count up to the
alignment (on the host, from the counts a dispatcher already read, so it costs no device read);
:func:`pad_rows` scatters the real rows into a zero-filled padded buffer and :func:`unpad_rows`
gathers them back. Both are differentiable (``index_copy`` / ``index_select``), and the padding
rows receive no gradient.

Empty groups stay empty unless ``min_rows`` asks for a floor (some grouped-GEMM kernels dislike
zero-row groups; the caller decides).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from areal_tasks.errors import EngineError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupedLayout:
    """Where each group's rows live in the padded buffer.

    ``counts`` real rows per group, ``padded_counts`` rows reserved per group, ``starts`` the first
    padded row of each group, ``offsets`` the cumulative ends (``torch._grouped_mm``'s ``offs``),
    ``total`` the padded buffer's row count.
    """

    counts: tuple[int, ...]
    padded_counts: tuple[int, ...]
    starts: tuple[int, ...]
    offsets: tuple[int, ...]
    total: int

    def offsets_tensor(self, device: torch.device | str) -> torch.Tensor:
        """``offs`` for ``torch._grouped_mm``: int32 cumulative group ends on ``device``."""
        return torch.tensor(self.offsets, dtype=torch.int32, device=device)

    def row_index(self, device: torch.device | str) -> torch.Tensor:
        """For each real row (in sorted order), its row in the padded buffer (long, ``[sum(counts)]``)."""
        starts = torch.tensor(self.starts, dtype=torch.long)
        counts = torch.tensor(self.counts, dtype=torch.long)
        n_rows = sum(self.counts)
        group_start = starts.repeat_interleave(counts, output_size=n_rows)
        first_real = (torch.cumsum(counts, 0) - counts).repeat_interleave(counts, output_size=n_rows)
        return (group_start + torch.arange(n_rows) - first_real).to(device)


def grouped_layout(counts: Sequence[int], alignment: int = 8, *, min_rows: int = 0) -> GroupedLayout:
    """Pad each group of ``counts`` to a multiple of ``alignment`` rows (and at least ``min_rows``)."""
    if not isinstance(alignment, int) or alignment < 1:
        raise EngineError(f"alignment must be an integer >= 1, got {alignment!r}")
    if min_rows < 0:
        raise EngineError(f"min_rows must be >= 0, got {min_rows!r}")
    counts = tuple(int(c) for c in counts)
    if any(c < 0 for c in counts):
        raise EngineError(f"group counts must be >= 0, got {list(counts)}")
    padded = tuple(-(-max(c, min_rows) // alignment) * alignment for c in counts)
    starts, offsets, end = [], [], 0
    for size in padded:
        starts.append(end)
        end += size
        offsets.append(end)
    return GroupedLayout(counts, padded, tuple(starts), tuple(offsets), end)


def pad_rows(x_sorted: torch.Tensor, layout: GroupedLayout) -> torch.Tensor:
    """The rows of ``x_sorted`` (grouped as ``layout.counts``) in a zero-padded ``[total, H]`` buffer."""
    if x_sorted.shape[0] != sum(layout.counts):
        raise EngineError(f"x_sorted has {x_sorted.shape[0]} rows, the layout's counts sum to {sum(layout.counts)}")
    buffer = x_sorted.new_zeros(layout.total, *x_sorted.shape[1:])
    return buffer.index_copy(0, layout.row_index(x_sorted.device), x_sorted)


def unpad_rows(y_padded: torch.Tensor, layout: GroupedLayout) -> torch.Tensor:
    """The real rows of a padded buffer, back in sorted order (``[sum(counts), ...]``)."""
    if y_padded.shape[0] != layout.total:
        raise EngineError(f"y_padded has {y_padded.shape[0]} rows, the layout has {layout.total}")
    return y_padded.index_select(0, layout.row_index(y_padded.device))
