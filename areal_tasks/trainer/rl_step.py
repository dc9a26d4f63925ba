"""One RL training step on one train rank: the compute between "a batch arrived" and "weights updated".

``RLStep.run(batch)`` on every rank, with the same whole batch everywhere:

1. take this rank's data-parallel share (groups whole, balanced by tokens);
2. forward passes without gradients on the share: proximal log-probs (decoupled PPO, when the
   algorithm recomputes them), reference log-probs (KL), critic values; exchange them so every rank
   holds them for the whole batch;
3. advantages on the whole batch (``Algorithm.compute_advantages``);
4. the actor update in ``actor.ppo_n_minibatches`` PPO mini-batches of the share, then the critic
   update the same way; step both LR schedules.

It returns the step's statistics (losses, KL, clip fraction, grad norms, advantage and reward
means). Nothing here talks to inference servers: the loop (``rl_loop.py``) does.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.algo import keys
from areal_tasks.api.faults import fault_point
from areal_tasks.errors import AlgorithmError
from areal_tasks.trace import span
from areal_tasks.trainer.rl_batch import gather_token_outputs, share_of

if TYPE_CHECKING:
    import torch

    from areal_tasks.algo.base import Algorithm
    from areal_tasks.api.train_engine import ForwardEngine, TrainableEngine

logger = logging.getLogger(__name__)


@dataclass
class RLStep:
    """The engines of one rank (any backend: typed by the role each plays) and the algorithm that
    drives them."""

    actor: TrainableEngine
    algorithm: Algorithm
    group_size: int
    ref: ForwardEngine | None = None
    critic: TrainableEngine | None = None
    ppo_n_minibatches: int = 1

    def run(self, batch: dict[str, torch.Tensor], step: int | None = None) -> dict[str, float]:
        """Train on ``batch`` (the same on every rank); return the step's statistics (``step``
        names the step for the fault tests' ``rl.step.before_update`` point)."""
        from areal_tasks.engine.microbatch import select_sequences

        info = self.actor.parallel
        parts = share_of(batch, info, self.group_size)
        share = select_sequences(batch, parts[info.dp_rank])
        local: dict[str, Any] = {}
        if self.algorithm.needs_prox_logprobs:
            with span("proximal forward", "train"):
                local[keys.PROX_LOGPROBS] = self.actor.forward_batch(share)[keys.LOGPROBS]
        if self.algorithm.needs_ref:
            if self.ref is None:
                raise AlgorithmError("algorithm.kl_coef > 0 needs a reference model: set the `ref` engine section")
            with span("reference forward", "train"):
                local[keys.REF_LOGPROBS] = self.ref.forward_batch(share)[keys.LOGPROBS]
        if self.algorithm.needs_critic:
            if self.critic is None:
                raise AlgorithmError(f"{self.algorithm.config.name} needs a critic: set the `critic` engine section")
            with span("critic forward", "train"):
                local[keys.VALUES] = self.critic.forward_batch(share)[keys.VALUES]
        with span("advantages", "train"):
            full = {**batch, **gather_token_outputs(batch, parts, info, local)} if local else dict(batch)
            full = self.algorithm.compute_advantages(full)
        share = select_sequences(full, parts[info.dp_rank])
        fault_point("rl.step.before_update", step=step)
        with span("actor update", "train"):
            stats = self._update(self.actor, share, self.algorithm.actor_loss_fn, self.algorithm.actor_loss_weight_fn)
        out = {f"actor/{k}": v for k, v in stats.items()}
        out["actor/lr"] = stats.get("lr", 0.0)
        self.actor.step_lr_scheduler()
        if self.critic is not None and self.algorithm.needs_critic:
            with span("critic update", "train"):
                critic_stats = self._update(
                    self.critic, share, self.algorithm.critic_loss_fn, self.algorithm.critic_loss_weight_fn
                )
            out.update({f"critic/{k}": v for k, v in critic_stats.items()})
            self.critic.step_lr_scheduler()
        out.update(batch_statistics(full))
        out.update(self.algorithm.kl_statistics(full))
        return out

    def _update(
        self, engine: TrainableEngine, share: dict[str, torch.Tensor], loss_fn: Any, weight_fn: Any
    ) -> dict[str, float]:
        """``ppo_n_minibatches`` optimizer steps over consecutive slices of the share; averaged stats."""
        from areal_tasks.engine.microbatch import select_sequences, sequence_lengths

        n_seqs, n_mb = len(sequence_lengths(share)), self.ppo_n_minibatches
        if n_seqs < n_mb:  # every rank must run the same number of optimizer steps
            raise AlgorithmError(
                f"this rank's share has {n_seqs} sequences, fewer than actor.ppo_n_minibatches={n_mb}: "
                "raise train.batch_size or lower ppo_n_minibatches"
            )
        bounds = [round(i * n_seqs / n_mb) for i in range(n_mb + 1)]
        # every mini-batch's step is queued before any is read back: the host splits the next
        # mini-batch while the device runs the previous one
        steps = [
            engine.submit_train_batch(select_sequences(share, range(lo, hi)), loss_fn, weight_fn)
            for lo, hi in itertools.pairwise(bounds)
        ]
        totals: dict[str, float] = {}
        for step in steps:
            for key, value in step.result().items():
                totals[key] = totals.get(key, 0.0) + float(value) / n_mb
        return totals


def batch_statistics(batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Reward, advantage, length and staleness figures of a (whole) batch."""
    import torch

    mask = batch[keys.LOSS_MASK].bool()
    cu = batch[keys.CU_SEQLENS]
    lengths = (cu[1:] - cu[:-1]).to(torch.float32)
    generated = torch.zeros(len(lengths))
    for i in range(len(lengths)):
        generated[i] = mask[int(cu[i]) : int(cu[i + 1])].sum()
    rewards = batch[keys.REWARDS].to(torch.float32)
    out = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "reward/max": float(rewards.max()),
        "response_len/mean": float(generated.mean()),
        "seq_len/mean": float(lengths.mean()),
        "n_tokens": float(cu[-1]),
    }
    if keys.ADVANTAGES in batch and bool(mask.any()):
        adv = batch[keys.ADVANTAGES][mask]
        out["advantage/mean"], out["advantage/abs_mean"] = float(adv.mean()), float(adv.abs().mean())
    if bool(mask.any()):
        version = batch[keys.POLICY_VERSION]
        token_version = torch.repeat_interleave(version, (cu[1:] - cu[:-1]).long())
        staleness = (token_version - batch[keys.VERSIONS])[mask].to(torch.float32)
        out["staleness/mean"], out["staleness/max"] = float(staleness.mean()), float(staleness.max())
    return out
