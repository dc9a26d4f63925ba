"""Generalized Advantage Estimation (Schulman et al. 2015) over padded and packed layouts.

``A_t = sum_k (gamma * lambda)^k * delta_{t+k}`` with ``delta_t = r_t + gamma * V_{t+1} - V_t``,
and returns ``R_t = A_t + V_t``. Without a critic (``values=None``, i.e. ``V = 0``) and with
``lambda = 1`` this is the discounted reward-to-go ``sum_k gamma^k r_{t+k}``.

Departures from the paper: (1) the trajectory of a sequence is its loss-masked tokens only, in
order; tokens outside ``loss_mask`` (prompt, tool output in multi-turn episodes) are skipped, so
``V_{t+1}`` is the value of the next *trained* token, not of the next position. (2) Every sequence
is treated as terminal after its last trained token (``V = 0`` beyond it), also when generation was
truncated: there is no bootstrap value for a cut-off LLM response. (3) Accumulation is float64;
outputs have the reward dtype and are 0 outside ``loss_mask``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_tasks.algo.layout import packed_to_padded, padded_to_packed
from areal_tasks.errors import AlgorithmError


def _check_rates(gamma: float, lam: float) -> None:
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise AlgorithmError(f"GAE needs 0 <= gamma <= 1 and 0 <= lambda <= 1, got gamma={gamma}, lambda={lam}")


def gae_padded(
    rewards: Tensor,
    values: Tensor | None,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """GAE on a ``[B, L]`` layout; returns ``(advantages, returns)``, both ``[B, L]``.

    ``rewards`` are per-token (typically the sequence reward at the last trained token, minus a
    KL penalty at every trained token); ``values`` are the critic's ``V_t`` or ``None``.
    """
    _check_rates(gamma, lam)
    if rewards.dim() != 2 or rewards.shape != mask.shape:
        raise AlgorithmError(
            f"gae_padded wants [B, L] rewards and mask, got {tuple(rewards.shape)}, {tuple(mask.shape)}"
        )
    if values is not None and values.shape != rewards.shape:
        raise AlgorithmError(f"values shape {tuple(values.shape)} != rewards shape {tuple(rewards.shape)}")
    mask = mask.bool()
    r64 = rewards.detach().to(torch.float64)
    v64 = torch.zeros_like(r64) if values is None else values.detach().to(torch.float64)
    # Move each row's trained tokens to the front, in order (stable sort on "not trained").
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    r_c = torch.gather(torch.where(mask, r64, 0.0), 1, order)
    v_c = torch.gather(torch.where(mask, v64, 0.0), 1, order)
    length = mask.sum(dim=1)
    batch, width = rewards.shape
    adv_c = torch.zeros_like(r_c)
    running = torch.zeros(batch, dtype=torch.float64, device=rewards.device)
    for t in range(width - 1, -1, -1):
        valid = t < length
        has_next = (t + 1) < length
        next_value = v_c[:, t + 1] if t + 1 < width else torch.zeros_like(running)
        next_value = torch.where(has_next, next_value, 0.0)
        delta = r_c[:, t] + gamma * next_value - v_c[:, t]
        running = torch.where(valid, delta + gamma * lam * torch.where(has_next, running, 0.0), 0.0)
        adv_c[:, t] = running
    adv = torch.zeros_like(adv_c).scatter(1, order, adv_c)
    returns = torch.where(mask, adv + v64, 0.0)
    return adv.to(rewards.dtype), returns.to(rewards.dtype)


def gae_packed(
    rewards: Tensor,
    values: Tensor | None,
    mask: Tensor,
    cu_seqlens: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """GAE on the packed ``[T]`` layout (via the padded one); returns ``(advantages, returns)``."""
    if rewards.shape != mask.shape or rewards.dim() != 1:
        raise AlgorithmError(f"gae_packed wants [T] rewards and mask, got {tuple(rewards.shape)}, {tuple(mask.shape)}")
    r_pad, valid = packed_to_padded(rewards, cu_seqlens)
    m_pad, _ = packed_to_padded(mask.bool(), cu_seqlens, pad_value=False)
    v_pad = None if values is None else packed_to_padded(values, cu_seqlens)[0]
    adv, ret = gae_padded(r_pad, v_pad, m_pad & valid, gamma, lam)
    return padded_to_packed(adv, cu_seqlens), padded_to_packed(ret, cu_seqlens)
