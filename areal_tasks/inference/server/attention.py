"""The serving attention: transformers' SDPA attention, with grouped-query decode that never copies keys.

A decode step has one query per sequence. With grouped-query attention (Qwen2.5-0.5B: 14 query
heads, 2 key/value heads) SDPA with a mask would otherwise need the keys and values repeated up to
the query heads, a 7x copy of the whole cache span every layer and step. Here the ``g`` query heads
that share a key/value head are laid along SDPA's query-length axis instead
(``[B, H, 1, D] -> [B, H_kv, g, D]``), so each key/value head is read once and the per-row mask
``[B, 1, 1, L]`` broadcasts over them. Everything else (prefill, masks with a head axis, models
without GQA) is transformers' own ``sdpa_attention_forward``, unchanged.

Registered with transformers as ``attn_implementation="areal_serve"`` (no mask builder of its own:
the model runner prepares every mask, and transformers passes them through untouched).
"""

from __future__ import annotations

from typing import Any

import torch

SERVE_ATTN = "areal_serve"


def serve_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0,
                            scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """``(attn_output [B, T, H, D], None)`` like transformers' SDPA attention (see the module doc)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    grouped = (q_len == 1 and heads != kv_heads and heads % kv_heads == 0 and dropout == 0.0
               and (attention_mask is None or attention_mask.shape[1] == 1)
               and kwargs.get("position_bias") is None and kwargs.get("softcap") is None)
    if not grouped:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped_query = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped_query, key, value, attn_mask=attention_mask, scale=scaling, is_causal=False
    )
    return out.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous(), None


def register_serve_attention() -> str:
    """Register :func:`serve_attention_forward` with transformers (once); returns its name."""
    from areal_tasks.engine.fsdp.attention import register_attention

    return register_attention(SERVE_ATTN, serve_attention_forward)
