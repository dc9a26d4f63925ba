"""Fixtures of the archon model tests: packed batches and transformers references on the tiny models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch


@dataclass
class Packed:
    """One packed row of several sequences, in the archon forward's layout."""

    input_ids: torch.Tensor  # [1, T]
    position_ids: torch.Tensor  # [1, T]
    cu_seqlens: torch.Tensor  # [S + 1] int32
    bounds: tuple[int, ...]
    labels: torch.Tensor  # [1, T]: the next token of the packed stream

    def sequences(self) -> list[torch.Tensor]:
        ids = self.input_ids[0]
        return [ids[a:b] for a, b in zip(self.bounds[:-1], self.bounds[1:])]

    def scored(self) -> torch.Tensor:
        """Positions whose label is the next token of the same sequence (all but each sequence's last)."""
        keep = torch.ones(self.input_ids.shape[1], dtype=torch.bool)
        keep[torch.tensor(self.bounds[1:]) - 1] = False
        return keep


def make_packed(lengths: tuple[int, ...] = (5, 9, 3, 7), vocab: int = 1024, seed: int = 0) -> Packed:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (sum(lengths),), generator=gen)
    bounds = (0, *torch.cumsum(torch.tensor(lengths), 0).tolist())
    pos = torch.cat([torch.arange(n) for n in lengths])
    return Packed(
        input_ids=ids[None],
        position_ids=pos[None],
        cu_seqlens=torch.tensor(bounds, dtype=torch.int32),
        bounds=tuple(bounds),
        labels=torch.roll(ids, -1)[None],
    )


@pytest.fixture
def packed() -> Callable[..., Packed]:
    return make_packed


@pytest.fixture
def hf_causal_lm() -> Callable[..., torch.nn.Module]:
    """``load(model_dir) -> transformers causal LM`` in fp32, eval mode, eager attention."""
    from transformers import AutoModelForCausalLM

    def load(model_dir, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="eager").eval()

    return load


def hf_scores(model: torch.nn.Module, batch: Packed, temperature: float, **kwargs) -> tuple[torch.Tensor, list]:
    """transformers' ``[n_scored, 2]`` log-prob and entropy, one sequence at a time (and the per-sequence outputs)."""
    from areal_tasks.kernels.logprobs import next_token_stats

    rows, outputs = [], []
    for seq in batch.sequences():
        out = model(input_ids=seq[None], **kwargs)
        lp, ent = next_token_stats(out.logits[0, :-1], seq[1:], temperature=temperature, with_entropy=True)
        rows.append(torch.stack([lp, ent], -1))
        outputs.append(out)
    return torch.cat(rows), outputs


@pytest.fixture
def hf_reference() -> Callable[..., tuple[torch.Tensor, list]]:
    return hf_scores
