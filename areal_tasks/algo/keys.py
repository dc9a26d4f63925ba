"""Batch keys that algorithms read or add, beyond those of ``areal_tasks/api/batch.py``.

Per-token keys are ``[T]``, per-sequence keys ``[B]`` (their names start with ``seq_`` so that the
micro-batch splitter slices them per sequence). No paper to depart from.
"""

from __future__ import annotations

from areal_tasks.api.batch import CU_SEQLENS, GROUP_IDS, LOGPROBS, LOSS_MASK, REWARDS, VERSIONS

ADVANTAGES = "advantages"  # [T] added by Algorithm.compute_advantages
RETURNS = "returns"  # [T] added when there is a critic (value targets)
VALUES = "values"  # [T] critic values at rollout time (batch) / current values (engine outputs)
REF_LOGPROBS = "ref_logprobs"  # [T] reference-model log-probs (needed when kl_coef > 0)
PROX_LOGPROBS = "prox_logprobs"  # [T] recomputed proximal-policy log-probs (decoupled PPO)
ENTROPY = "entropy"  # [T] engine output, needed when entropy_coef > 0
POLICY_VERSION = "seq_policy_version"  # [B] version the trainer holds at the start of the step

__all__ = [
    "ADVANTAGES",
    "CU_SEQLENS",
    "ENTROPY",
    "GROUP_IDS",
    "LOGPROBS",
    "LOSS_MASK",
    "POLICY_VERSION",
    "PROX_LOGPROBS",
    "REF_LOGPROBS",
    "RETURNS",
    "REWARDS",
    "VALUES",
    "VERSIONS",
]
