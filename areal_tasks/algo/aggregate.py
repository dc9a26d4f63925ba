"""Loss aggregation: turn per-token losses into one scalar, and say how many units it averages.

Modes (``L_it`` the loss of token ``t`` of sequence ``i``, ``M`` the loss mask, ``S`` the set of
sequences with at least one trained token, ``C`` a constant):

==========================  ========================================  ==========================
mode                        value                                     units (``loss_weight``)
==========================  ========================================  ==========================
``token_mean``              ``sum_it M L / sum_it M``                 trained tokens
``seq_mean_token_sum``      ``(1/|S|) sum_i sum_t M L``               sequences in ``S``
``seq_mean_token_mean``     ``(1/|S|) sum_i (sum_t M L / sum_t M)``   sequences in ``S``
``seq_mean_token_sum_norm`` ``(1/(|S| C)) sum_it M L`` (Dr.GRPO)      ``|S| * C``
==========================  ========================================  ==========================

The loss-weight contract with the train engine: each micro-batch's mean is multiplied by
``loss_weight(mb) / sum over all micro-batches and ranks of loss_weight``. Because each value is
``(sum of per-unit terms) / units``, that product sums to the full-batch value exactly, however the
batch is split (sequences are never split across micro-batches). The weight depends only on the
loss mask and ``cu_seqlens``, never on model outputs.

Departures: GRPO's ``1/G sum_i 1/|o_i|`` is ``seq_mean_token_mean``; sequences without trained
tokens (e.g. fully masked groups) are left out of ``|S|`` rather than counted as zeros. Both the
packed (``[T]`` + ``cu_seqlens``) and padded (``[B, L]`` + mask) layouts are accepted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_tasks.algo.layout import masked_segment_sum, segment_sum
from areal_tasks.errors import AlgorithmError

MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def _per_sequence(values: Tensor, mask: Tensor, cu_seqlens: Tensor | None) -> tuple[Tensor, Tensor]:
    """(per-sequence masked sums, per-sequence trained-token counts) for either layout."""
    mask = mask.bool()
    if values.shape != mask.shape:
        raise AlgorithmError(f"loss shape {tuple(values.shape)} != mask shape {tuple(mask.shape)}")
    if values.dim() == 2:
        sums = torch.where(mask, values, torch.zeros_like(values)).sum(dim=1)
        return sums, mask.sum(dim=1).to(values.dtype)
    if values.dim() == 1 and cu_seqlens is not None:
        return masked_segment_sum(values, mask, cu_seqlens), segment_sum(mask.to(values.dtype), cu_seqlens)
    raise AlgorithmError("aggregate: pass [T] values with cu_seqlens, or [B, L] values with a [B, L] mask")


def _check(mode: str, constant: float | None) -> None:
    if mode not in MODES:
        raise AlgorithmError(f"loss aggregation mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "seq_mean_token_sum_norm" and (constant is None or constant <= 0):
        raise AlgorithmError(f"seq_mean_token_sum_norm needs a constant > 0, got {constant}")


def aggregate_loss(
    values: Tensor,
    mask: Tensor,
    cu_seqlens: Tensor | None = None,
    mode: str = "token_mean",
    constant: float | None = None,
) -> Tensor:
    """Mean of per-token ``values`` over this batch's units (see the table); 0 if it has none.

    The result keeps the gradient; an empty batch returns ``0 * values.sum()`` (finite, with grad).
    """
    _check(mode, constant)
    sums, counts = _per_sequence(values, mask, cu_seqlens)
    active = counts > 0
    if mode == "token_mean":
        return sums.sum() / counts.sum().clamp(min=1)
    n_seq = active.sum().clamp(min=1).to(values.dtype)
    if mode == "seq_mean_token_sum":
        return sums.sum() / n_seq
    if mode == "seq_mean_token_mean":
        return (sums / counts.clamp(min=1)).sum() / n_seq
    return sums.sum() / (n_seq * float(constant))  # type: ignore[arg-type]


def loss_weight(
    mask: Tensor, cu_seqlens: Tensor | None = None, mode: str = "token_mean", constant: float | None = None
) -> float:
    """Number of units :func:`aggregate_loss` averages over in this (micro-)batch."""
    _check(mode, constant)
    _, counts = _per_sequence(mask.to(torch.float64), mask, cu_seqlens)
    if mode == "token_mean":
        return float(counts.sum())
    n_seq = float((counts > 0).sum())
    return n_seq * float(constant) if mode == "seq_mean_token_sum_norm" else n_seq  # type: ignore[arg-type]
