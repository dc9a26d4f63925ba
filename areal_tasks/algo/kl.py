"""KL estimators between the policy and a reference model, per token (Schulman 2020, "Approximating
KL divergence").

With ``log_ratio = logp - logp_ref`` for a token sampled from the policy:

* ``k1 = log_ratio``                          unbiased, high variance, can be negative
* ``k2 = log_ratio**2 / 2``                   biased, low variance, >= 0
* ``k3 = exp(-log_ratio) - 1 + log_ratio``    unbiased, low variance, >= 0 (GRPO's estimator)

All three are exactly 0 where the policy equals the reference. Gradients flow to both arguments;
callers detach what must be constant.

Departure: with ``clamp = c`` the log-ratio is clamped to ``[-c, c]`` before use (so ``exp`` cannot
overflow) and the estimate itself to ``[-c, c]``; peers clamp only k3's output.
"""

from __future__ import annotations

import torch
from torch import Tensor

from areal_tasks.errors import AlgorithmError

ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logp: Tensor, logp_ref: Tensor, estimator: str = "k3", clamp: float | None = 10.0) -> Tensor:
    """Per-token KL estimate ``KL(pi || pi_ref)`` of the given kind, same shape as ``logp``."""
    if logp.shape != logp_ref.shape:
        raise AlgorithmError(f"kl_estimate: shapes differ, {tuple(logp.shape)} vs {tuple(logp_ref.shape)}")
    log_ratio = logp - logp_ref
    if clamp is not None:
        log_ratio = log_ratio.clamp(-clamp, clamp)
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.square()
    elif estimator == "k3":
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
    else:
        raise AlgorithmError(f"kl_estimate: estimator={estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl
