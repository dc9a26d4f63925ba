"""The packed attention behind Ulysses equals attention on each sequence alone, with GQA (fewer
key/value heads) and with a sliding window."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.fsdp.attention import packed_attention


def _alone(q, k, v, bounds, window):
    outs = []
    rep = q.shape[1] // k.shape[1]
    for a, b in zip(bounds, bounds[1:]):
        i = torch.arange(b - a)
        mask = i[None, :] <= i[:, None]
        if window is not None:
            mask &= (i[:, None] - i[None, :]) < window
        scores = q[:, :, a:b] @ k[:, :, a:b].repeat_interleave(rep, 1).transpose(-1, -2) * 0.25
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        outs.append(probs @ v[:, :, a:b].repeat_interleave(rep, 1))
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("window", [None, 3])
def test_packed_attention_matches_each_sequence_alone(window):
    gen = torch.Generator().manual_seed(0)
    bounds = (0, 1, 6, 15, 19)
    q = torch.randn(1, 4, 19, 16, generator=gen)
    k, v = torch.randn(1, 2, 19, 16, generator=gen), torch.randn(1, 2, 19, 16, generator=gen)
    out = packed_attention(q, k, v, torch.tensor(bounds), bounds=bounds, scaling=0.25, sliding_window=window)
    torch.testing.assert_close(out, _alone(q, k, v, bounds, window), atol=1e-5, rtol=1e-5)
