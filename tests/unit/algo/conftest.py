"""Fixtures for the algorithm tests: a small random packed batch that respects the layout of
``areal_tasks/api/batch.py``, and a splitter into micro-batches of whole sequences."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import Tensor

from areal_tasks.api.batch import is_per_sequence_key

Batch = dict[str, Tensor]


def build_batch(
    seq_lens: Sequence[int] = (6, 5, 7, 4, 6, 5, 3, 4),
    prompt_lens: Sequence[int] | None = None,
    group_ids: Sequence[int] = (0, 0, 0, 0, 1, 1, 1, 1),
    rewards: Sequence[float] | None = None,
    seed: int = 0,
    policy_version: int = 3,
) -> Batch:
    """Packed batch with behaviour, proximal, reference log-probs, critic values and versions."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = prompt_lens or [2] * len(seq_lens)
    lens = torch.tensor(seq_lens)
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    total = int(lens.sum())
    pos = torch.arange(total) - torch.repeat_interleave(cu[:-1].long(), lens)
    loss_mask = pos >= torch.repeat_interleave(torch.tensor(prompt_lens), lens)
    behav = torch.where(loss_mask, -torch.rand(total, generator=gen) * 2 - 0.05, 0.0)
    versions = torch.randint(policy_version - 2, policy_version + 1, (total,), generator=gen)
    if rewards is None:
        rewards = torch.randint(0, 2, (len(seq_lens),), generator=gen).float().tolist()
    return {
        "input_ids": torch.randint(0, 100, (total,), generator=gen),
        "cu_seqlens": cu,
        "loss_mask": loss_mask,
        "logprobs": behav,
        "prox_logprobs": torch.where(loss_mask, behav + 0.3 * torch.randn(total, generator=gen), 0.0),
        "ref_logprobs": torch.where(loss_mask, behav + 0.2 * torch.randn(total, generator=gen), 0.0),
        "values": torch.randn(total, generator=gen),
        "versions": torch.where(loss_mask, versions, -1),
        "rewards": torch.tensor(rewards, dtype=torch.float32),
        "group_ids": torch.tensor(group_ids),
        "seq_policy_version": torch.full((len(seq_lens),), policy_version),
    }


def split_batch(batch: Batch, bounds: Sequence[int]) -> list[Batch]:
    """Micro-batches of whole sequences: ``bounds`` are sequence indices, e.g. ``[0, 2, 5, 8]``."""
    cu = batch["cu_seqlens"].long()
    out = []
    for lo, hi in itertools.pairwise(bounds):
        t0, t1 = int(cu[lo]), int(cu[hi])
        mb: Batch = {}
        for key, value in batch.items():
            if key == "cu_seqlens":
                mb[key] = (cu[lo : hi + 1] - t0).to(torch.int32)
            elif is_per_sequence_key(key) or key == "group_ids":
                mb[key] = value[lo:hi]
            else:
                mb[key] = value[t0:t1]
        out.append(mb)
    return out


@pytest.fixture
def make_batch() -> Callable[..., Batch]:
    return build_batch


@pytest.fixture
def split() -> Callable[[Batch, Sequence[int]], list[Batch]]:
    return split_batch
