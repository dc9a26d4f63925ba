"""Grouped-query self-attention over packed sequences, with the Ulysses context-parallel hook.

The projections are plain ``nn.Linear`` named as in transformers (``q_proj``, ``k_proj``, ``v_proj``,
``o_proj``; ``q_norm``/``k_norm`` for qwen3), so tensor-parallel plans and the HF name map read
obviously. ``n_heads``/``n_kv_heads`` are this rank's head counts: a tensor-parallel plan divides
them in place (the forward reshapes by ``head_dim``, so it follows the sharded weights either way).

The attention itself is :func:`areal_tasks.kernels.attention.packed_attention` (block-diagonal causal
attention over ``cu_seqlens``). With ``cp_group`` set, every rank holds a contiguous slice of the
packed stream and the kernel runs under Ulysses: rope is applied locally (position ids are per
token), one all-to-all trades "all heads of my tokens" for "my heads of all tokens", the kernel runs
with the *global* ``cu_seqlens``, and a second all-to-all trades back (the exchanges of
:mod:`areal_tasks.engine.parallel.ulysses`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from areal_tasks.engine.archon.model.layers import RMSNorm, apply_rope
from areal_tasks.engine.parallel.ulysses import _heads_to_seq, _seq_to_heads
from areal_tasks.errors import EngineError
from areal_tasks.kernels.attention import packed_attention, repeat_heads

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)


class Attention(nn.Module):
    """Causal GQA self-attention of one decoder layer (qkv bias and q/k RMSNorm per family)."""

    def __init__(
        self,
        hidden_size: int,
        n_heads: int,
        n_kv_heads: int,
        head_dim: int,
        *,
        qkv_bias: bool = False,
        o_bias: bool = False,
        qk_norm: bool = False,
        norm_eps: float = 1e-6,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.scaling = head_dim**-0.5
        self.sliding_window = sliding_window
        self.cp_group: ProcessGroup | None = None
        self.q_proj = nn.Linear(hidden_size, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, norm_eps) if qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cu_seqlens: torch.Tensor,
        bounds: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """``x [1, T, H]`` -> ``[1, T, H]``; ``rope`` the ``(cos, sin)`` tables of these positions."""
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.q_proj(x).view(shape)
        k = self.k_proj(x).view(shape)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
        if self.cp_group is None:
            out = packed_attention(
                q, k, v, cu_seqlens, bounds=bounds, scaling=self.scaling, sliding_window=self.sliding_window
            )
        else:
            out = self._ulysses(q, k, v, cu_seqlens, bounds)
        out = out.transpose(1, 2).reshape(*x.shape[:-1], -1)
        return self.o_proj(out)

    def _ulysses(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor,
        bounds: tuple[int, ...] | None,
    ) -> torch.Tensor:
        group = self.cp_group
        assert group is not None
        sp = group.size()
        n_q, n_kv = q.shape[1], k.shape[1]
        if n_q % sp != 0:
            raise EngineError(f"context parallel size {sp} must divide the attention heads per rank ({n_q})")
        if n_kv % sp != 0:  # too few key/value heads to split: replicate them up to the query heads
            k, v = repeat_heads(k, n_q // n_kv), repeat_heads(v, n_q // n_kv)
        q, k, v = _seq_to_heads([q, k, v], group, sp)
        out = packed_attention(
            q, k, v, cu_seqlens, bounds=bounds, scaling=self.scaling, sliding_window=self.sliding_window
        )
        return _heads_to_seq(out, group, sp)
