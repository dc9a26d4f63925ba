"""Per-token policy and value losses: the PPO clipped surrogate (asymmetric and dual clip) and the
clipped critic loss (MSE or Huber). Aggregation to a scalar lives in ``aggregate.py``.

PPO surrogate (Schulman et al. 2017), per token, with ratio ``r`` and advantage ``A``::

    L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)

``eps_high > eps_low`` is DAPO's clip-higher. Dual clip (Ye et al. 2020, "Mastering Complex Control
in MOBA Games"): for ``A < 0`` the loss is additionally bounded, ``L = min(L, -c A)`` with ``c > 1``,
so a huge ratio on a bad token cannot produce an unbounded step. Outside the trust region in the
direction the advantage pushes (``r > 1 + eps_high`` with ``A > 0``; ``r < 1 - eps_low`` with
``A < 0``) the gradient is exactly zero.

Critic (PPO2's value clipping)::

    L_V = max(f(V - R), f(V_old + clip(V - V_old, -c, c) - R)),  f = x^2 / 2 or Huber(delta)

Departure: the MSE carries the conventional 1/2; with ``value_clip=None`` only the first term.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from areal_tasks.errors import AlgorithmError


@dataclass(frozen=True)
class SurrogateOutput:
    """Per-token PPO loss and which branch was active (bool masks, for statistics)."""

    loss: Tensor
    clipped: Tensor  # the clipped term was the binding one (gradient zero there)
    dual_clipped: Tensor  # the dual-clip bound was binding


def ppo_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    eps_low: float = 0.2,
    eps_high: float | None = None,
    dual_clip: float | None = None,
) -> SurrogateOutput:
    """Per-token clipped surrogate loss (to minimise), same shape as ``ratio``."""
    eps_high = eps_low if eps_high is None else eps_high
    if eps_low <= 0 or eps_high <= 0:
        raise AlgorithmError(f"ppo_surrogate: clip epsilons must be > 0, got {eps_low}, {eps_high}")
    advantages = advantages.detach()
    unclipped = -ratio * advantages
    clipped_term = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped_term)
    clipped = clipped_term > unclipped
    dual_clipped = torch.zeros_like(clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise AlgorithmError(f"ppo_surrogate: dual_clip must be > 1, got {dual_clip}")
        bound = -dual_clip * advantages
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(dual_clipped, bound, loss)
    return SurrogateOutput(loss, clipped, dual_clipped)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    clip: float | None = 0.2,
    kind: str = "mse",
    huber_delta: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Per-token clipped critic loss and a bool mask of tokens where the clipped term was binding."""

    def f(pred: Tensor) -> Tensor:
        if kind == "mse":
            return 0.5 * (pred - returns).square()
        if kind == "huber":
            return F.huber_loss(pred, returns, reduction="none", delta=huber_delta)
        raise AlgorithmError(f"value_loss: kind={kind!r}; choose mse or huber")

    returns = returns.detach()
    old_values = old_values.detach()
    plain = f(values)
    if clip is None:
        return plain, torch.zeros_like(plain, dtype=torch.bool)
    clipped_pred = old_values + (values - old_values).clamp(-clip, clip)
    clipped = f(clipped_pred)
    return torch.maximum(plain, clipped), clipped > plain
