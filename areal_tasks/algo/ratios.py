"""Importance ratios for (decoupled) PPO: token- and sequence-level ratios, the proximal policy's
log-linear approximation, and the behaviour importance weight.

Decoupled PPO (AReaL, Fu et al. 2025, after Hilton et al. 2022) separates the *behaviour* policy
that sampled a token (possibly several versions old) from the *proximal* policy that the trust
region is centred on (the policy at the start of this train step). The ratio that is clipped is
``pi_theta / pi_prox``; the loss is weighted by ``pi_prox / pi_behav``, which corrects for the
staleness of the samples.

* Token level: ``r_t = exp(logp_t - logp_old_t)``.
* Sequence level (GSPO, Zheng et al. 2025): ``s_i = exp(mean_t (logp_t - logp_old_t))`` over the
  sequence's trained tokens, broadcast to them; its gradient is the length-normalised sequence
  gradient of GSPO.
* Log-linear proximal approximation (AReaL's ``prox_logp_method="loglinear"``): with ``v_t`` the
  version that generated token ``t``, ``v`` the version the trainer holds at the start of this step
  (= the proximal policy) and ``v + 1`` the version being trained,
  ``alpha_t = (v - v_t) / (v + 1 - v_t)`` clamped to ``[0, 1]`` and
  ``log pi_prox ~= log pi_behav + alpha_t * (log pi_theta - log pi_behav)`` (detached). A token from
  the current version has ``alpha = 0`` (behaviour is proximal); a very stale token has
  ``alpha -> 1``. Departure: AReaL counts versions so that its "current version" is our ``v + 1``;
  the formula is the same.
* Behaviour weight ``w = exp(logp_prox - logp_behav)`` at token level, or at sequence level the
  length-normalised ``exp(mean_t(...))``; above ``cap`` it is truncated to ``cap`` (``"truncate"``)
  or set to 0 (``"mask"``, the token or the whole sequence then contributes nothing). Departure:
  masked tokens stay in the loss normaliser, so the normaliser never depends on model outputs
  (needed for exact micro-batch accumulation); AReaL's mask also drops nothing from it.

Log-ratios are taken only on masked tokens (0 elsewhere) and clamped to ``[-20, 20]`` before
``exp``, so padding or prompt tokens can never produce inf or NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from areal_tasks.algo.layout import broadcast_to_tokens, masked_segment_mean
from areal_tasks.errors import AlgorithmError

MAX_LOG_RATIO = 20.0


def masked_log_ratio(logp: Tensor, logp_old: Tensor, mask: Tensor) -> Tensor:
    """``logp - logp_old`` on masked tokens, 0 elsewhere, clamped to ``[-20, 20]``."""
    diff = torch.where(mask.bool(), logp - logp_old, torch.zeros_like(logp))
    return diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def importance_ratio(
    logp: Tensor, logp_old: Tensor, mask: Tensor, cu_seqlens: Tensor | None = None, level: str = "token"
) -> Tensor:
    """Per-token ratio ``[T]``: token level, or the sequence-level GSPO ratio broadcast to tokens."""
    log_ratio = masked_log_ratio(logp, logp_old, mask)
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        if cu_seqlens is None:
            raise AlgorithmError("importance_ratio at sequence level needs cu_seqlens")
        seq = masked_segment_mean(log_ratio, mask, cu_seqlens)
        return torch.exp(broadcast_to_tokens(seq, cu_seqlens))
    raise AlgorithmError(f"importance_ratio: level={level!r}; choose token or sequence")


def loglinear_prox_logprobs(
    behav_logprobs: Tensor, logprobs: Tensor, versions: Tensor, policy_version: Tensor | int
) -> Tensor:
    """Approximate proximal log-probs from per-token versions (detached, ``[T]``).

    ``policy_version`` is the version the trainer holds at the start of the step (scalar, or per
    token). Prompt tokens (version < 0) get the behaviour log-prob.
    """
    v_b = versions.to(torch.float64)
    v = torch.as_tensor(policy_version, device=versions.device).to(torch.float64)
    if bool((versions > v).any()):
        raise AlgorithmError(
            f"a token's version ({int(versions.max())}) is newer than the trainer's policy version "
            f"({v.max().item():.0f}); the batch or seq_policy_version is wrong"
        )
    alpha = ((v - v_b) / (v + 1.0 - v_b)).clamp(0.0, 1.0)
    alpha = torch.where(versions >= 0, alpha, 0.0).to(behav_logprobs.dtype)
    behav = behav_logprobs.detach()
    return behav + alpha * (logprobs.detach() - behav)


@dataclass(frozen=True)
class BehaviourWeights:
    """Behaviour importance weights ``[T]`` (0 outside the loss mask) and what the cap did."""

    weights: Tensor
    raw: Tensor  # before truncation/masking
    capped: Tensor  # bool [T]: tokens whose weight the cap changed


def behaviour_weights(
    prox_logprobs: Tensor,
    behav_logprobs: Tensor,
    mask: Tensor,
    cu_seqlens: Tensor | None = None,
    *,
    level: str = "token",
    cap: float | None = None,
    mode: str = "truncate",
) -> BehaviourWeights:
    """``exp(prox - behav)`` per token or per sequence, truncated or masked above ``cap``; detached."""
    if mode not in ("truncate", "mask"):
        raise AlgorithmError(f"behaviour_weights: mode={mode!r}; choose truncate or mask")
    mask = mask.bool()
    raw = importance_ratio(prox_logprobs.detach(), behav_logprobs.detach(), mask, cu_seqlens, level)
    raw = torch.where(mask, raw, torch.zeros_like(raw))
    if cap is None:
        return BehaviourWeights(raw, raw, torch.zeros_like(mask))
    capped = mask & (raw > cap)
    limited = torch.full_like(raw, cap) if mode == "truncate" else torch.zeros_like(raw)
    return BehaviourWeights(torch.where(capped, limited, raw), raw, capped)
