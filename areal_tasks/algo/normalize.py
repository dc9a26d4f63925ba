"""Reward and advantage normalisation at batch or group level, with leave-one-out baselines.

``normalize(x) = (x - baseline) / (std + eps)`` where the baseline (mean) and the standard deviation
are each chosen independently at level ``"none"``, ``"batch"`` or ``"group"``:

* mean ``"group"``: mean of the entries sharing a group id (GRPO); with ``leave_one_out`` the mean
  of the *other* entries of the group, ``(S - x_i) / (n - 1)`` (RLOO); ``"batch"``: the same over
  all entries; ``"none"``: baseline 0.
* std ``"group"`` / ``"batch"``: the Bessel-corrected standard deviation of the raw entries at that
  level; ``"none"``: no division (and no epsilon).

Works on sequence-level vectors (``[B]`` rewards with ``[B]`` group ids) and token-level vectors
(``[T]`` advantages with ``[T]`` group ids and a loss mask selecting the entries that take part).

Departures / edge cases (the papers leave them open): statistics accumulate in float64; masked-out
entries neither contribute nor receive a value (output 0); a group with a single entry has
standard deviation 0 and, under leave-one-out, baseline equal to its own value (advantage 0, no
signal from a lone sample); a fully masked group yields zeros, never NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_tasks.errors import AlgorithmError

LEVELS = ("none", "batch", "group")


def _group_stats(x: Tensor, mask: Tensor, index: Tensor, n_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group (count, sum, sum of squares) in float64 over masked entries."""
    w = mask.to(torch.float64)
    xm = torch.where(mask, x, 0.0)
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=x.device)
    count = zeros.index_add(0, index, w)
    total = zeros.index_add(0, index, xm)
    return count, total, zeros.index_add(0, index, xm * xm)


def _mean_and_std(x: Tensor, mask: Tensor, index: Tensor, n_groups: int, leave_one_out: bool) -> tuple[Tensor, Tensor]:
    """Per-entry baseline and per-entry std for a grouping given by ``index`` (float64)."""
    count, total, sq = _group_stats(x, mask, index, n_groups)
    n, s = count[index], total[index]
    mean = s / n.clamp(min=1)
    # Sum of squared deviations from the mean; clamp tiny negative rounding to zero.
    ss = (sq[index] - s * mean).clamp(min=0.0)
    std = torch.sqrt(ss / (n - 1).clamp(min=1))
    baseline = torch.where(n > 1, (s - x) / (n - 1).clamp(min=1), x) if leave_one_out else mean
    return baseline, std


def normalize(
    x: Tensor,
    *,
    mean_level: str = "group",
    std_level: str = "group",
    group_ids: Tensor | None = None,
    mask: Tensor | None = None,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Subtract a baseline and divide by a standard deviation, each at its own level.

    ``x``, ``group_ids`` and ``mask`` are 1-D and aligned. ``group_ids`` is needed only when a
    level is ``"group"``. Returns a tensor of ``x``'s dtype; entries outside ``mask`` are 0.
    Not differentiable on purpose: advantages are constants of the loss.
    """
    for name, level in (("mean_level", mean_level), ("std_level", std_level)):
        if level not in LEVELS:
            raise AlgorithmError(f"normalize: {name}={level!r}; choose one of {', '.join(LEVELS)}")
    if x.dim() != 1:
        raise AlgorithmError(f"normalize wants a 1-D tensor, got shape {tuple(x.shape)}")
    mask = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.bool()
    if mask.shape != x.shape:
        raise AlgorithmError(f"mask shape {tuple(mask.shape)} != x shape {tuple(x.shape)}")
    x64 = torch.where(mask, x.detach().to(torch.float64), 0.0)

    def stats(level: str) -> tuple[Tensor, Tensor]:
        if level == "group":
            if group_ids is None or group_ids.shape != x.shape:
                raise AlgorithmError("normalize at group level needs group_ids aligned with x")
            _, index = torch.unique(group_ids, return_inverse=True)
            return _mean_and_std(x64, mask, index, int(index.max()) + 1 if index.numel() else 0, leave_one_out)
        index = torch.zeros_like(x64, dtype=torch.long)
        return _mean_and_std(x64, mask, index, 1, leave_one_out)

    out = x64
    if mean_level != "none":
        out = out - stats(mean_level)[0]
    if std_level != "none":
        out = out / (stats(std_level)[1] + eps)
    return torch.where(mask, out, 0.0).to(x.dtype)
