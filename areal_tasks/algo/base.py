"""The ``Algorithm`` interface the trainer uses, its registry, and helpers shared by algorithms.

An algorithm turns a packed batch into advantages (``compute_advantages``), supplies the loss the
train engine minimises (``actor_loss_fn`` with ``actor_loss_weight_fn``; critic ones when it has a
critic), and may give the rollout side a group filter (``group_filter``: DAPO's dynamic sampling).
Algorithms are chosen by ``config.name`` through :func:`build_algorithm`. The engine contract:
``loss, stats = loss_fn(outputs, mb)`` returns a mean over the micro-batch's units; the engine
scales it by ``loss_weight_fn(mb) / total weight``.

The shared actor loss is decoupled PPO (``actor.py``) plus an optional entropy bonus and an optional
KL-to-reference loss term, aggregated the same way. Departures from the papers are documented in
the algorithm modules and in docs/algorithms.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, TypeVar

import torch
from torch import Tensor

from areal_tasks.algo import keys
from areal_tasks.algo.actor import DecoupledPPOSettings, decoupled_ppo_loss, masked_mean_stat, resolve_prox_logprobs
from areal_tasks.algo.aggregate import aggregate_loss, loss_weight
from areal_tasks.algo.kl import kl_estimate
from areal_tasks.algo.layout import last_masked_index, masked_segment_sum
from areal_tasks.algo.shaping import shape_rewards
from areal_tasks.api.rollout import GroupFilter
from areal_tasks.config.algorithm import AlgorithmConfig, PolicyGradientConfig
from areal_tasks.errors import AlgorithmError

Batch = dict[str, Tensor]
LossOutput = tuple[Tensor, dict[str, float]]

_ALGORITHMS: dict[str, type[Algorithm]] = {}
A = TypeVar("A", bound=type["Algorithm"])


def register_algorithm(name: str) -> Callable[[A], A]:
    """Class decorator: make an Algorithm selectable as ``algorithm.name: <name>``."""

    def wrap(cls: A) -> A:
        if name in _ALGORITHMS:
            raise AlgorithmError(f"algorithm {name!r} is registered twice")
        _ALGORITHMS[name] = cls
        return cls

    return wrap


def algorithm_names() -> list[str]:
    """Names of all registered algorithms."""
    return sorted(_ALGORITHMS)


def build_algorithm(config: AlgorithmConfig) -> Algorithm:
    """The Algorithm registered under ``config.name``, built from ``config``."""
    try:
        cls = _ALGORITHMS[config.name]
    except KeyError:
        raise AlgorithmError(
            f"algorithm.name: no algorithm {config.name!r}; choose one of: {', '.join(algorithm_names())}"
        ) from None
    return cls(config)


def require(batch: Batch, *names: str, why: str) -> None:
    """Raise an AlgorithmError naming the missing keys."""
    missing = [n for n in names if n not in batch]
    if missing:
        raise AlgorithmError(f"{why}: the batch lacks {missing}")


class Algorithm(ABC):
    """Base of every RL algorithm: a config plus what the trainer needs from it."""

    config_class: ClassVar[type[PolicyGradientConfig]]
    needs_critic: ClassVar[bool] = False
    #: "token" (PPO) or "sequence" (GSPO): level of the ratio pi_theta / pi_prox.
    ratio_level: ClassVar[str] = "token"

    def __init__(self, config: PolicyGradientConfig) -> None:
        if not isinstance(config, self.config_class):
            raise AlgorithmError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}; "
                "build it with AlgorithmConfig.variant_class(name)"
            )
        self.config = config

    # --- what the trainer asks -----------------------------------------------------------------
    @property
    def needs_ref(self) -> bool:
        """Whether ``ref_logprobs`` must be computed (KL coefficient > 0)."""
        return self.config.kl_coef > 0

    @property
    def needs_prox_logprobs(self) -> bool:
        """Whether the trainer must recompute ``prox_logprobs`` before training."""
        return self.config.prox_approx == "recompute"

    @abstractmethod
    def compute_advantages(self, batch: Batch) -> Batch:
        """A new batch dict: ``batch`` plus ``advantages`` [T] (and ``returns`` [T] with a critic)."""

    @property
    def group_filter(self) -> GroupFilter | None:
        """The filter the rollout side applies to each finished group (False drops the group and a
        new prompt takes its place), or None to keep every group (the default; DAPO's dynamic
        sampling has one)."""
        return None

    def actor_loss_fn(self, outputs: Batch, mb: Batch) -> LossOutput:
        """Decoupled PPO + entropy bonus + optional KL loss, a mean over this micro-batch's units."""
        c = self.config
        require(outputs, keys.LOGPROBS, why="actor loss")
        require(mb, keys.CU_SEQLENS, keys.LOSS_MASK, keys.ADVANTAGES, keys.LOGPROBS, why="actor loss")
        logp, mask, cu = outputs[keys.LOGPROBS], mb[keys.LOSS_MASK].bool(), mb[keys.CU_SEQLENS]
        prox = resolve_prox_logprobs(mb, logp, c.prox_approx)
        loss, stats = decoupled_ppo_loss(logp, prox, mb[keys.LOGPROBS], mb[keys.ADVANTAGES], mask, cu, self._settings())
        if c.entropy_coef > 0:
            require(outputs, keys.ENTROPY, why="entropy_coef > 0")
            entropy = aggregate_loss(outputs[keys.ENTROPY], mask, cu, c.loss_agg_mode, c.loss_agg_constant)
            loss = loss - c.entropy_coef * entropy
        if keys.ENTROPY in outputs:
            stats["entropy"] = masked_mean_stat(outputs[keys.ENTROPY], mask)
        if self.needs_ref and not c.kl_in_reward:
            require(mb, keys.REF_LOGPROBS, why="KL loss term (kl_coef > 0)")
            kl = kl_estimate(logp, mb[keys.REF_LOGPROBS].detach(), c.kl_estimator, c.kl_clamp)
            loss = loss + c.kl_coef * aggregate_loss(kl, mask, cu, c.loss_agg_mode, c.loss_agg_constant)
            stats["kl_ref"] = masked_mean_stat(kl, mask)
        stats["loss"] = float(loss.detach())
        return loss, stats

    def actor_loss_weight_fn(self, mb: Batch) -> float:
        """Units ``actor_loss_fn`` averages over in ``mb`` (tokens, sequences, or sequences x C)."""
        c = self.config
        return loss_weight(mb[keys.LOSS_MASK], mb[keys.CU_SEQLENS], c.loss_agg_mode, c.loss_agg_constant)

    def critic_loss_fn(self, outputs: Batch, mb: Batch) -> LossOutput:
        raise AlgorithmError(f"{type(self).__name__} has no critic (needs_critic is False)")

    def critic_loss_weight_fn(self, mb: Batch) -> float:
        raise AlgorithmError(f"{type(self).__name__} has no critic (needs_critic is False)")

    # --- helpers for subclasses ----------------------------------------------------------------
    def _settings(self) -> DecoupledPPOSettings:
        c = self.config
        return DecoupledPPOSettings(
            eps_low=c.eps_clip,
            eps_high=c.eps_clip_high,
            dual_clip=c.dual_clip,
            ratio_level=self.ratio_level,
            use_behav_weight=c.use_behav_imp_weight,
            behav_cap=c.behav_imp_weight_cap,
            behav_mode=c.behav_imp_weight_mode,
            behav_level=c.behav_imp_weight_level,
            agg_mode=c.loss_agg_mode,
            agg_constant=c.loss_agg_constant,
        )

    def shaped_rewards(self, batch: Batch) -> Tensor:
        """Sequence rewards ``[B]`` after bias, scale and clip (float)."""
        require(batch, keys.REWARDS, why="compute_advantages")
        c = self.config
        rewards = batch[keys.REWARDS].to(torch.get_default_dtype())
        return shape_rewards(rewards, c.reward_bias, c.reward_scale, c.reward_clip)

    def token_kl(self, batch: Batch) -> Tensor:
        """Per-token KL(policy || ref) on trained tokens, 0 elsewhere ``[T]``, for the reward.

        The policy side is ``prox_logprobs`` when present, else the behaviour ``logprobs``.
        """
        require(batch, keys.REF_LOGPROBS, keys.LOSS_MASK, why="KL in reward (kl_coef > 0)")
        policy = batch.get(keys.PROX_LOGPROBS, batch[keys.LOGPROBS]).detach()
        c = self.config
        kl = kl_estimate(policy, batch[keys.REF_LOGPROBS].detach(), c.kl_estimator, c.kl_clamp)
        return torch.where(batch[keys.LOSS_MASK].bool(), kl, 0.0)

    def kl_statistics(self, batch: Batch) -> dict[str, float]:
        """``kl_ref/mean``: the mean per-token KL(policy || ref) over the batch's trained tokens, by the
        configured estimator (the policy side as in :meth:`token_kl`); empty without ``ref_logprobs``.
        Logged whether the KL enters the reward or the loss, so a job with a reference model always
        reports how far the policy has moved from it."""
        if keys.REF_LOGPROBS not in batch:
            return {}
        return {"kl_ref/mean": masked_mean_stat(self.token_kl(batch), batch[keys.LOSS_MASK])}

    def sequence_kl(self, batch: Batch) -> Tensor:
        """Sum of :meth:`token_kl` over each sequence's trained tokens ``[B]``."""
        return masked_segment_sum(self.token_kl(batch), batch[keys.LOSS_MASK], batch[keys.CU_SEQLENS])

    @staticmethod
    def terminal_token_rewards(seq_rewards: Tensor, mask: Tensor, cu_seqlens: Tensor) -> Tensor:
        """``[T]`` token rewards: each sequence's reward on its last trained token, 0 elsewhere."""
        out = torch.zeros(mask.shape[0], dtype=seq_rewards.dtype, device=seq_rewards.device)
        last = last_masked_index(mask, cu_seqlens)
        has = last >= 0
        return out.index_put((last[has],), seq_rewards[has])
