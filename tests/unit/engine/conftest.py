"""Fixtures of the engine tests that build a whole ``FSDPEngine`` in the test process."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def world_of_one(tmp_path) -> Iterator[None]:
    """A one-rank gloo process group for the test (left as found: one already running stays)."""
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if started:
        dist.destroy_process_group()


def _packed_batch(seed: int = 0, n_seqs: int = 6, vocab: int = 200) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 18, (n_seqs,), generator=gen)
    cu = torch.zeros(n_seqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    total = int(cu[-1])
    mask = torch.ones(total, dtype=torch.int32)
    mask[cu[:-1].long()] = 0  # a sequence's first token has no prediction to score
    return {
        "input_ids": torch.randint(0, vocab, (total,), generator=gen),
        "cu_seqlens": cu,
        "loss_mask": mask,
        "advantages": torch.randn(total, generator=gen),
    }


@pytest.fixture
def packed_batch() -> Callable[..., dict[str, torch.Tensor]]:
    """``packed_batch(seed=0, n_seqs=6, vocab=200)``: a packed batch of random sequences (3-17
    tokens) with advantages and a loss mask, as the engine's ``train_batch`` takes it."""
    return _packed_batch
