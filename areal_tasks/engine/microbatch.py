"""Splitting a packed batch into micro-batches, and sharing a batch between data-parallel ranks.

A packed batch (:mod:`areal_tasks.api.batch`) is cut along sequence boundaries: which sequences go
together is decided by :func:`areal_tasks.engine.packing.partition` (FFD or Karmarkar-Karp, whole
``granularity`` groups), and every micro-batch is again a valid packed batch with its own
``cu_seqlens`` and ``position_ids`` that restart at 0 for every sequence, so attention can be
block-diagonal (varlen flash attention, or SDPA/flex attention with a block mask) with no pad
token inside.

Padding. With ``pad_to_multiple_of = m > 1`` a micro-batch of ``n`` tokens gets one *dummy
sequence* of ``-n % m`` tokens appended as its last sequence (its own ``cu_seqlens`` entry, so it
attends only to itself). Every tensor of the dummy is zero, except ``position_ids`` (``0..p-1``):
``loss_mask`` is 0, so a loss that weights tokens by ``loss_mask`` ignores it, and
:meth:`MicroBatchPlan.merge` drops the outputs of padding. The cap ``max_tokens_per_mb`` counts
padding, so sequences are packed under ``max_tokens_per_mb`` rounded down to a multiple of ``m``.
If there are fewer sequence groups than micro-batches required, whole dummy micro-batches (one
dummy sequence of ``m`` tokens, ``loss_mask`` all 0) make up the count: every data-parallel rank
must run the same number of forward/backward passes. Such a micro-batch has no token to average
over, so the engine must guard a zero loss weight (skip the division, keep the backward pass).

Same count on every rank: split, ask :func:`agree_on_n_mbs` for the maximum over the DP group, and
split again with ``n_mbs_override`` when the local count is lower::

    plan = split_into_micro_batches(batch, spec)
    n = agree_on_n_mbs(plan.n_micro_batches, dp_group)
    if n != plan.n_micro_batches:
        plan = split_into_micro_batches(batch, spec, n_mbs_override=n)

Vision-language batches: ``pixel_values`` and ``image_grid_thw`` are indexed by image patch and by
image (:mod:`areal_tasks.engine.image_rows`); a micro-batch takes the images of its sequences, in
its sequence order, and dummy sequences hold no image (``seq_n_images`` 0, no rows).

``spec.memory_budget_gb`` is not read here: the engine turns it into ``max_tokens_per_mb`` with
:func:`areal_tasks.models.memory.resolve_max_tokens_per_mb` (it needs the model) before splitting.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from areal_tasks.api.batch import CU_SEQLENS, INPUT_IDS, POSITION_IDS, is_image_key, is_per_sequence_key
from areal_tasks.engine.image_rows import check_image_keys, select_image_keys
from areal_tasks.engine.packing import partition
from areal_tasks.errors import ConfigError, EngineError

if TYPE_CHECKING:
    from areal_tasks.config.micro_batch import MicroBatchSpec

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]


@dataclass
class MicroBatchPlan:
    """The micro-batches of one batch and how to put their outputs back in the batch's order."""

    #: valid packed batches, each possibly ending in one dummy padding sequence.
    micro_batches: list[Batch]
    #: original sequence indices in each micro-batch, in the order they appear there
    #: (empty for a dummy micro-batch).
    indices: list[list[int]]
    #: tokens of the original sequences of the batch.
    lengths: list[int]
    #: padding tokens added (alignment dummies and dummy micro-batches).
    n_padded_tokens: int

    @property
    def n_micro_batches(self) -> int:
        """How many forward/backward passes the plan needs."""
        return len(self.micro_batches)

    @property
    def n_tokens(self) -> int:
        """Real (non-padding) tokens of the batch."""
        return sum(self.lengths)

    def tokens_per_micro_batch(self) -> list[int]:
        """Computed tokens of every micro-batch, padding included."""
        return [int(mb[CU_SEQLENS][-1]) for mb in self.micro_batches]

    def merge(self, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Concatenate per-micro-batch outputs back into the original batch's order.

        ``outputs[k]`` belongs to ``micro_batches[k]`` and is either per token (first dimension =
        the micro-batch's tokens, padding included) or per sequence (first dimension = its
        sequences, dummy included). Padding entries are dropped; the result has ``T`` (or ``B``)
        rows in the original order. When both readings fit, every sequence has one token and the
        two readings agree.
        """
        if len(outputs) != self.n_micro_batches:
            raise EngineError(f"merge got {len(outputs)} outputs for {self.n_micro_batches} micro-batches")
        rows = [int(out.shape[0]) if out.dim() else -1 for out in outputs]
        mb_tokens = self.tokens_per_micro_batch()
        mb_seqs = [len(mb[CU_SEQLENS]) - 1 for mb in self.micro_batches]
        lengths = torch.tensor(self.lengths, dtype=torch.long)
        order = torch.tensor([i for part in self.indices for i in part], dtype=torch.long)
        if rows == mb_tokens:
            real = [sum(self.lengths[i] for i in part) for part in self.indices]
            merged = torch.cat([out[:n] for out, n in zip(outputs, real)])
            gather = _gather_tokens_back(lengths, order)
        elif rows == mb_seqs:
            merged = torch.cat([out[: len(part)] for out, part in zip(outputs, self.indices)])
            gather = torch.empty_like(order)
            gather[order] = torch.arange(len(order))
        else:
            raise EngineError(
                f"merge: output rows {rows} match neither the micro-batches' tokens {mb_tokens} "
                f"nor their sequences {mb_seqs}"
            )
        return merged.index_select(0, gather.to(merged.device))


def position_ids_from_cu_seqlens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Positions ``0..len-1`` of every sequence, concatenated (int64, on ``cu_seqlens``' device)."""
    cu = cu_seqlens.to(torch.long)
    total = int(cu[-1])
    return torch.arange(total, device=cu.device) - _repeat_by_lengths(cu[:-1], cu[1:] - cu[:-1], total)


def split_into_micro_batches(
    batch: Mapping[str, torch.Tensor], spec: MicroBatchSpec, *, n_mbs_override: int | None = None
) -> MicroBatchPlan:
    """Split a packed batch into at least ``spec.n_mbs`` (or ``n_mbs_override``) micro-batches.

    Sequences are packed by ``spec.packing`` under ``spec.max_tokens_per_mb`` (padding counted),
    keeping ``spec.granularity`` consecutive sequences together; see the module docstring for the
    padding rules.
    """
    lengths = sequence_lengths(batch)
    if not lengths:
        raise EngineError("cannot split an empty batch (cu_seqlens holds no sequence)")
    multiple = spec.pad_to_multiple_of
    cap = spec.max_tokens_per_mb
    if cap is not None:
        cap = cap // multiple * multiple
        if cap < 1:
            raise ConfigError(
                f"max_tokens_per_mb={spec.max_tokens_per_mb} is smaller than pad_to_multiple_of={multiple}"
            )
    required = spec.n_mbs if n_mbs_override is None else n_mbs_override
    if isinstance(required, bool) or not isinstance(required, int) or required < 1:
        raise ConfigError(f"n_mbs_override must be None or an integer >= 1, got {n_mbs_override!r}")
    parts = partition(lengths, max_tokens=cap, min_parts=required, method=spec.packing, granularity=spec.granularity)
    micro_batches: list[Batch] = []
    padded = 0
    for part in parts:
        mb = _with_position_ids(_select(batch, part))
        pad = -sum(lengths[i] for i in part) % multiple
        if pad:
            mb = _concat(mb, _dummy_like(mb, pad))
            padded += pad
        micro_batches.append(mb)
    indices = [list(part) for part in parts]
    while len(micro_batches) < required:
        micro_batches.append(_dummy_like(micro_batches[0], multiple))
        indices.append([])
        padded += multiple
    logger.debug(
        "split %d sequences (%d tokens) into %d micro-batches (%s, %d padding tokens)",
        len(lengths),
        sum(lengths),
        len(micro_batches),
        spec.packing,
        padded,
    )
    return MicroBatchPlan(micro_batches=micro_batches, indices=indices, lengths=lengths, n_padded_tokens=padded)


def agree_on_n_mbs(local_n: int, group: Any = None) -> int:
    """The maximum of ``local_n`` over the process ``group`` (all_reduce MAX).

    Returns ``local_n`` unchanged when torch.distributed is not initialised or the group has one
    rank (no collective, no device read-back).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return local_n
    backend = str(dist.get_backend(group))
    on_cuda = "nccl" in backend and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    count = torch.tensor([local_n], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    return int(count.item())


def dp_partition(batch: Mapping[str, torch.Tensor], dp_size: int, *, granularity: int = 1) -> list[list[int]]:
    """Sequence indices for each of ``dp_size`` ranks, balanced by tokens (Karmarkar-Karp).

    Groups of ``granularity`` consecutive sequences stay on one rank. Raises :class:`EngineError`
    when there are fewer groups than ranks (a rank would have nothing to train on).
    """
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ConfigError(f"dp_size must be an integer >= 1, got {dp_size!r}")
    lengths = sequence_lengths(batch)
    n_units = len(lengths) // max(granularity, 1)
    if n_units < dp_size:
        raise EngineError(
            f"cannot share {len(lengths)} sequences ({n_units} groups of {granularity}) between {dp_size} "
            "data-parallel ranks: every rank needs at least one group; enlarge the batch"
        )
    return partition(lengths, max_tokens=None, min_parts=dp_size, method="kk", granularity=granularity)


def dp_split(batch: Mapping[str, torch.Tensor], dp_size: int, *, granularity: int = 1) -> list[Batch]:
    """The batch of each data-parallel rank (see :func:`dp_partition`), each a valid packed batch."""
    return [_select(batch, part) for part in dp_partition(batch, dp_size, granularity=granularity)]


def select_sequences(batch: Mapping[str, torch.Tensor], seq_indices: Sequence[int]) -> Batch:
    """A packed batch of the given sequences, in the given order (per-token and per-sequence keys)."""
    lengths = sequence_lengths(batch)
    bad = [i for i in seq_indices if not 0 <= i < len(lengths)]
    if bad:
        raise EngineError(f"sequence index {bad[0]} out of range for a batch of {len(lengths)} sequences")
    return _select(batch, seq_indices)


def sequence_lengths(batch: Mapping[str, torch.Tensor]) -> list[int]:
    """Check that ``batch`` is a valid packed batch and return its sequence lengths."""
    if CU_SEQLENS not in batch:
        raise EngineError(f"a packed batch needs {CU_SEQLENS!r}; got keys {sorted(batch)}")
    cu = batch[CU_SEQLENS]
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or len(cu) < 1 or int(cu[0]) != 0:
        raise EngineError(f"{CU_SEQLENS!r} must be a 1-D tensor starting at 0, got {cu!r}")
    bounds = cu.tolist()
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    if any(n < 1 for n in lengths):
        raise EngineError(f"{CU_SEQLENS!r} must be strictly increasing (every sequence >= 1 token): {bounds}")
    n_tokens, n_seqs = bounds[-1], len(lengths)
    for key, value in batch.items():
        if key == CU_SEQLENS:
            continue
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise EngineError(f"batch key {key!r} must be a tensor with a first dimension, got {type(value).__name__}")
        if is_image_key(key):
            continue  # by image or patch: check_image_keys below
        per_seq = is_per_sequence_key(key)
        expected = n_seqs if per_seq else n_tokens
        if value.shape[0] != expected:
            kind = "sequences (a per-sequence key)" if per_seq else "tokens (a per-token key)"
            raise EngineError(
                f"batch key {key!r} has first dimension {value.shape[0]}, expected {expected} {kind}; "
                "per-sequence keys are listed in areal_tasks.api.batch or start with 'seq_'"
            )
    check_image_keys(batch, n_seqs)
    return lengths


def _select(batch: Mapping[str, torch.Tensor], seq_indices: Sequence[int]) -> Batch:
    cu = batch[CU_SEQLENS].to(torch.long)
    seqs = torch.tensor(list(seq_indices), dtype=torch.long, device=cu.device)
    starts = cu[seqs]
    lengths = cu[seqs + 1] - starts
    new_cu = torch.cat([torch.zeros(1, dtype=torch.long, device=cu.device), torch.cumsum(lengths, 0)])
    total = int(new_cu[-1])
    tokens = _repeat_by_lengths(starts - new_cu[:-1], lengths, total) + torch.arange(total, device=cu.device)
    out: Batch = {CU_SEQLENS: new_cu.to(batch[CU_SEQLENS].dtype)}
    for key, value in batch.items():
        if key != CU_SEQLENS and not is_image_key(key):
            index = seqs if is_per_sequence_key(key) else tokens
            out[key] = value.index_select(0, index.to(value.device))
    out.update(select_image_keys(batch, seq_indices))
    return out


def _with_position_ids(mb: Batch) -> Batch:
    if POSITION_IDS not in mb:
        device = mb[INPUT_IDS].device if INPUT_IDS in mb else mb[CU_SEQLENS].device
        mb[POSITION_IDS] = position_ids_from_cu_seqlens(mb[CU_SEQLENS]).to(device)
    return mb


def _dummy_like(template: Batch, n_tokens: int) -> Batch:
    """One dummy sequence of ``n_tokens`` with ``template``'s keys: zeros, positions ``0..n-1``, no image."""
    out: Batch = {}
    for key, value in template.items():
        if key == CU_SEQLENS:
            out[key] = torch.tensor([0, n_tokens], dtype=value.dtype, device=value.device)
        elif key == POSITION_IDS:
            out[key] = torch.arange(n_tokens, dtype=value.dtype, device=value.device)
        else:
            rows = 0 if is_image_key(key) else 1 if is_per_sequence_key(key) else n_tokens
            out[key] = torch.zeros((rows, *value.shape[1:]), dtype=value.dtype, device=value.device)
    return out


def _concat(first: Batch, second: Batch) -> Batch:
    out: Batch = {}
    for key, value in first.items():
        if key == CU_SEQLENS:
            out[key] = torch.cat([value, second[key][1:] + value[-1]])
        else:
            out[key] = torch.cat([value, second[key]])
    return out


def _gather_tokens_back(lengths: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Index into tokens laid out sequence by sequence in ``order`` that restores the original order."""
    in_order = lengths[order]
    start_in_order = torch.cumsum(in_order, 0) - in_order
    start_of = torch.empty_like(lengths)
    start_of[order] = start_in_order
    original_start = torch.cumsum(lengths, 0) - lengths
    total = int(lengths.sum())
    return _repeat_by_lengths(start_of - original_start, lengths, total) + torch.arange(total)


def _repeat_by_lengths(values: torch.Tensor, lengths: torch.Tensor, total: int) -> torch.Tensor:
    """``torch.repeat_interleave(values, lengths)`` (``total`` = ``lengths.sum()``) by a cumulative sum
    of steps at segment starts: much faster on CPU, and correct for empty segments too."""
    starts = torch.cumsum(lengths, 0) - lengths
    steps = torch.diff(values, prepend=values.new_zeros(1))
    inside = starts < total
    out = torch.zeros(total, dtype=values.dtype, device=values.device)
    return out.index_add_(0, starts[inside], steps[inside]).cumsum(0)
