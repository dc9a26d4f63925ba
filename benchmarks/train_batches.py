"""The workload of the train throughput benchmark (``train_throughput.py``, also ``archon_moe.py`` and
``varlen_attention.py``): batches of long-tailed sequence lengths, trimmed to pack into an exact
number of micro-batches, the policy-gradient loss they train on, and the model FLOPs of a step.
"""

from __future__ import annotations

import numpy as np
import torch

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.microbatch import select_sequences, split_into_micro_batches


def long_tail_batch(total_tokens: int, max_len: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Sequences of lognormal lengths (median ~665) clipped to [32, max_len], about ``total_tokens`` in all."""
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < total_tokens:
        lengths.append(int(np.clip(rng.lognormal(6.5, 1.1), 32, max_len)))
    lengths[-1] -= sum(lengths) - total_tokens
    lengths = [n for n in lengths if n >= 2]
    total = sum(lengths)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    gen = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(0, vocab, (total,), generator=gen),
        "cu_seqlens": cu,
        "loss_mask": torch.ones(total, dtype=torch.int32),
        "advantages": torch.randn(total, generator=gen),
    }


def fill_micro_batches(batch: dict[str, torch.Tensor], spec: MicroBatchSpec, n_mbs: int) -> dict[str, torch.Tensor]:
    """``batch`` without the sequences the engine's packing puts after its first ``n_mbs``
    micro-batches (first-fit decreasing leaves later bins' placements unchanged, so the rest packs
    into exactly ``n_mbs``)."""
    plan = split_into_micro_batches(batch, spec)
    if plan.n_micro_batches <= n_mbs:
        return batch
    kept = sorted(i for indices in plan.indices[:n_mbs] for i in indices)
    filled = select_sequences(batch, kept)
    repacked = split_into_micro_batches(filled, spec).n_micro_batches
    if repacked != n_mbs:
        raise RuntimeError(f"the kept sequences pack into {repacked} micro-batches, not {n_mbs}")
    return filled


def pg_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    mask = mb["loss_mask"].float()
    return -(outputs["logprobs"] * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1.0), {}


def token_weight(mb: dict) -> float:
    return float(mb["loss_mask"].sum())


def step_flops(batch: dict, n_params: int, shape: dict) -> float:
    """Model FLOPs of one training step on ``batch`` (see ``train_throughput.py``'s module docstring)."""
    lengths = (batch["cu_seqlens"][1:] - batch["cu_seqlens"][:-1]).double()
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    attn = 6 * shape["num_hidden_layers"] * shape["num_attention_heads"] * head_dim * float((lengths**2).sum())
    return 6.0 * n_params * float(lengths.sum()) + attn
