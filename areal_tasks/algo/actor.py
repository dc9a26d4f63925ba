"""The decoupled PPO actor objective for asynchronous RL, as one pure function of tensors.

Per trained token ``t`` (AReaL, Fu et al. 2025, eq. 5; PPO when behaviour = proximal)::

    L_t = w_t * clipped_surrogate(pi_theta / pi_prox, A_t)      w_t = pi_prox / pi_behav (capped)

then aggregated by ``aggregate_loss``. The ratio is token-level (PPO) or the length-normalised
sequence ratio (GSPO); the behaviour weight is token- or sequence-level, truncated or masked above
its cap. :func:`resolve_prox_logprobs` picks the proximal policy: recomputed log-probs when the
micro-batch carries them, else the log-linear approximation from per-token versions, else (only
when asked for with ``prox_approx="none"``) the behaviour policy itself.

Departure from the peer implementation: the behaviour weight is applied by default
(``use_behav_weight=True``); it is not silently skipped unless an extra switch is set. Departure
from the paper: ``prox_approx="recompute"`` without recomputed log-probs is an error rather than a
silent fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from areal_tasks.algo import keys
from areal_tasks.algo.aggregate import aggregate_loss
from areal_tasks.algo.kl import kl_estimate
from areal_tasks.algo.layout import broadcast_to_tokens
from areal_tasks.algo.losses import ppo_surrogate
from areal_tasks.algo.ratios import behaviour_weights, importance_ratio, loglinear_prox_logprobs
from areal_tasks.errors import AlgorithmError


@dataclass(frozen=True)
class DecoupledPPOSettings:
    """Knobs of :func:`decoupled_ppo_loss` (built from an algorithm config)."""

    eps_low: float = 0.2
    eps_high: float | None = None
    dual_clip: float | None = None
    ratio_level: str = "token"
    use_behav_weight: bool = True
    behav_cap: float | None = 5.0
    behav_mode: str = "truncate"
    behav_level: str = "token"
    agg_mode: str = "token_mean"
    agg_constant: float | None = None


def resolve_prox_logprobs(mb: dict[str, Tensor], logprobs: Tensor, prox_approx: str) -> Tensor:
    """Proximal-policy log-probs ``[T]`` (detached) for a micro-batch; see the module docstring."""
    if keys.PROX_LOGPROBS in mb:
        return mb[keys.PROX_LOGPROBS].detach()
    behav = mb[keys.LOGPROBS].detach()
    if prox_approx == "loglinear":
        for key in (keys.VERSIONS, keys.POLICY_VERSION):
            if key not in mb:
                raise AlgorithmError(f"prox_approx=loglinear needs {key!r} in the micro-batch")
        version = broadcast_to_tokens(mb[keys.POLICY_VERSION], mb[keys.CU_SEQLENS])
        return loglinear_prox_logprobs(behav, logprobs, mb[keys.VERSIONS], version)
    if prox_approx == "none":
        return behav
    if prox_approx == "recompute":
        raise AlgorithmError(
            "prox_approx=recompute but the micro-batch has no 'prox_logprobs': the trainer must "
            "recompute them (Algorithm.needs_prox_logprobs), or set algorithm.prox_approx=loglinear"
        )
    raise AlgorithmError(f"prox_approx={prox_approx!r}; choose recompute, loglinear or none")


def masked_mean_stat(x: Tensor, mask: Tensor) -> float:
    """Detached mean of ``x`` over ``mask`` as a float; 0.0 when the mask is empty."""
    mask = mask.bool()
    n = int(mask.sum())
    return float(torch.where(mask, x.detach(), 0.0).sum() / n) if n else 0.0


def decoupled_ppo_loss(
    logprobs: Tensor,
    prox_logprobs: Tensor,
    behav_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    cu_seqlens: Tensor,
    settings: DecoupledPPOSettings = DecoupledPPOSettings(),
) -> tuple[Tensor, dict[str, float]]:
    """Aggregated decoupled PPO loss (differentiable w.r.t. ``logprobs``) and detached statistics."""
    mask = loss_mask.bool()
    s = settings
    ratio = importance_ratio(logprobs, prox_logprobs.detach(), mask, cu_seqlens, s.ratio_level)
    surrogate = ppo_surrogate(ratio, advantages, s.eps_low, s.eps_high, s.dual_clip)
    per_token = surrogate.loss
    stats: dict[str, float] = {}
    if s.use_behav_weight:
        bw = behaviour_weights(
            prox_logprobs, behav_logprobs, mask, cu_seqlens, level=s.behav_level, cap=s.behav_cap, mode=s.behav_mode
        )
        per_token = per_token * bw.weights
        stats["behav_weight_mean"] = masked_mean_stat(bw.weights, mask)
        stats["behav_weight_max"] = float(bw.raw.max()) if bool(mask.any()) else 0.0
        stats["behav_capped_frac"] = masked_mean_stat(bw.capped.to(ratio.dtype), mask)
    loss = aggregate_loss(per_token, mask, cu_seqlens, s.agg_mode, s.agg_constant)
    with torch.no_grad():
        log_ratio = torch.where(mask, logprobs.detach() - prox_logprobs.detach(), 0.0)
        stats["pg_loss"] = float(loss.detach())
        stats["clip_frac"] = masked_mean_stat(surrogate.clipped.to(ratio.dtype), mask)
        stats["dual_clip_frac"] = masked_mean_stat(surrogate.dual_clipped.to(ratio.dtype), mask)
        stats["ratio_mean"] = masked_mean_stat(ratio, mask)
        stats["approx_kl"] = masked_mean_stat(kl_estimate(log_ratio, torch.zeros_like(log_ratio), "k3"), mask)
    return loss, stats
