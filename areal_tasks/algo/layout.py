"""Packed <-> padded layout helpers and per-sequence reductions over packed tensors.

A packed tensor is 1-D ``[T]`` with ``cu_seqlens [B+1]`` marking sequence boundaries (see
``areal_tasks/api/batch.py``); a padded tensor is ``[B, L]`` with a validity mask. Every reduction
here is differentiable with respect to its value argument and safe on empty sequences (sums of
nothing are 0, means of nothing are 0). No paper to depart from.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_tasks.errors import AlgorithmError


def seqlens(cu_seqlens: Tensor) -> Tensor:
    """Sequence lengths ``[B]`` (int64) from prefix sums ``[B+1]``."""
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise AlgorithmError(f"cu_seqlens must be 1-D with B+1 >= 1 entries, got shape {tuple(cu_seqlens.shape)}")
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if bool((lens < 0).any()):
        raise AlgorithmError("cu_seqlens must be non-decreasing")
    return lens


def sequence_index(cu_seqlens: Tensor, total: int | None = None) -> Tensor:
    """For every packed token, the index of its sequence: ``[T]`` int64."""
    lens = seqlens(cu_seqlens)
    n_tokens = int(cu_seqlens[-1]) if total is None else total
    if int(lens.sum()) != n_tokens:
        raise AlgorithmError(f"cu_seqlens covers {int(lens.sum())} tokens but the tensor has {n_tokens}")
    return torch.repeat_interleave(torch.arange(lens.numel(), device=cu_seqlens.device), lens)


def _positions(cu_seqlens: Tensor, seq_idx: Tensor) -> Tensor:
    starts = cu_seqlens[:-1].long().to(seq_idx.device)
    return torch.arange(seq_idx.numel(), device=seq_idx.device) - starts[seq_idx]


def packed_to_padded(x: Tensor, cu_seqlens: Tensor, pad_value: float = 0.0) -> tuple[Tensor, Tensor]:
    """``[T]`` packed -> (``[B, Lmax]`` padded, ``[B, Lmax]`` bool validity mask)."""
    seq_idx = sequence_index(cu_seqlens, x.shape[0])
    lens = seqlens(cu_seqlens)
    width = int(lens.max()) if lens.numel() else 0
    pos = _positions(cu_seqlens, seq_idx)
    padded = x.new_full((lens.numel(), width, *x.shape[1:]), pad_value)
    padded = padded.index_put((seq_idx, pos), x)
    valid = torch.zeros(lens.numel(), width, dtype=torch.bool, device=x.device)
    # a device-side True: ``valid[...] = True`` would copy a host scalar and synchronise the GPU stream
    valid.index_put_((seq_idx, pos), torch.ones((), dtype=torch.bool, device=x.device))
    return padded, valid


def padded_to_packed(x: Tensor, cu_seqlens: Tensor) -> Tensor:
    """``[B, L]`` padded (left-aligned) -> ``[T]`` packed, dropping the padding."""
    seq_idx = sequence_index(cu_seqlens)
    return x[seq_idx, _positions(cu_seqlens, seq_idx)]


def cu_seqlens_from_mask(valid: Tensor) -> Tensor:
    """``cu_seqlens`` (int32) of a left-aligned padded layout's ``[B, L]`` validity mask."""
    lens = valid.long().sum(dim=1)
    return torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(torch.int32)


def segment_sum(x: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Per-sequence sums ``[B]`` of a packed ``[T]`` tensor (differentiable)."""
    seq_idx = sequence_index(cu_seqlens, x.shape[0])
    out = x.new_zeros(seqlens(cu_seqlens).numel())
    return out.index_add(0, seq_idx, x)


def masked_segment_sum(x: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Per-sequence sums ``[B]`` over tokens where ``mask`` is true (masked-out values may be
    anything finite or not: they are selected away, not multiplied)."""
    return segment_sum(torch.where(mask.bool(), x, torch.zeros_like(x)), cu_seqlens)


def masked_segment_mean(x: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Per-sequence means ``[B]`` over masked tokens; 0 for a sequence with no masked token."""
    count = segment_sum(mask.to(x.dtype), cu_seqlens)
    return masked_segment_sum(x, mask, cu_seqlens) / count.clamp(min=1)


def broadcast_to_tokens(values: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Per-sequence ``[B]`` values repeated over each sequence's tokens: ``[T]``."""
    return values[sequence_index(cu_seqlens).to(values.device)]


def last_masked_index(mask: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Index into ``[T]`` of each sequence's last masked token, or -1 if it has none: ``[B]``."""
    seq_idx = sequence_index(cu_seqlens, mask.shape[0])
    pos = torch.where(mask.bool(), torch.arange(mask.shape[0], device=mask.device), -1)
    out = torch.full((seqlens(cu_seqlens).numel(),), -1, dtype=torch.long, device=mask.device)
    return out.scatter_reduce(0, seq_idx, pos, reduce="amax")
