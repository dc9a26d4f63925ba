"""The serving attention's grouped-query decode equals SDPA over repeated key/value heads, with and
without a per-row mask, and leaves every other case to transformers' SDPA attention."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import repeat_kv

from areal_tasks.inference.server.attention import serve_attention_forward


class _Module(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _reference(query, key, value, mask, groups):
    out = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask, scale=0.3
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(14, 2), (4, 2), (4, 4)])
def test_grouped_decode_matches_repeated_heads(masked, heads, kv_heads):
    gen = torch.Generator().manual_seed(0)
    batch, length, dim = 5, 11, 8
    query = torch.randn(batch, heads, 1, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, length, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, length, dim, generator=gen, dtype=torch.float64)
    filled = torch.tensor([1, 4, 11, 7, 2])
    mask = (torch.arange(length)[None, :] < filled[:, None]).view(batch, 1, 1, length) if masked else None
    out, weights = serve_attention_forward(_Module(heads // kv_heads), query, key, value, mask, scaling=0.3)
    assert weights is None and out.shape == (batch, 1, heads, dim)
    torch.testing.assert_close(out, _reference(query, key, value, mask, heads // kv_heads), atol=1e-12, rtol=1e-12)


def test_prefill_stays_causal():
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(2, 4, 6, 8, generator=gen, dtype=torch.float64)
    key = torch.randn(2, 2, 6, 8, generator=gen, dtype=torch.float64)
    value = torch.randn(2, 2, 6, 8, generator=gen, dtype=torch.float64)
    out, _ = serve_attention_forward(_Module(2), query, key, value, None, scaling=0.3)
    want = torch.nn.functional.scaled_dot_product_attention(
        query, repeat_kv(key, 2), repeat_kv(value, 2), is_causal=True, scale=0.3
    ).transpose(1, 2)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)
