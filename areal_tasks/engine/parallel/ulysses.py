"""Ulysses sequence parallelism on packed sequences: all-to-all over attention heads.

Each of the ``sp`` ranks of a sequence-parallel group holds a contiguous ``1/sp`` slice of the packed
token stream (padded to a multiple of ``sp``). Everything but attention is token-local, so only the
attention needs the other slices: before it, an all-to-all trades "all heads of my tokens" for "my
heads of all tokens"; attention runs on the full stream with a block-diagonal causal mask built from
the *global* ``cu_seqlens``; a second all-to-all trades back. RoPE is applied before the exchange,
from each token's own (per-sequence) position id, so it needs no communication.

The attention is registered with transformers as ``attn_implementation="areal_ulysses"``; the model
forward passes ``cu_seq_lens_q`` (global), ``areal_seq_bounds`` and ``areal_sp_group`` through its
``**kwargs`` to every attention call; the attention over the full stream is
:func:`areal_tasks.kernels.attention.packed_attention`. The per-token scores of the local slice are
gathered with :func:`gather_sequence`, whose backward keeps only the local slice of the gradient: every rank of
the group computes the same loss from the gathered scores, so each rank is responsible for exactly
its own positions, and the FSDP reduction over ``dp x sp`` sums the partial gradients.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError
from areal_tasks.kernels.attention import BOUNDS_KWARG, packed_attention, register_attention, repeat_heads

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)

ULYSSES_ATTN = "areal_ulysses"
SP_GROUP_KWARG = "areal_sp_group"

_registered = False


def _all_to_all_fn() -> type:
    import torch
    import torch.distributed as dist

    class _AllToAll(torch.autograd.Function):
        """Equal-split all-to-all along dim 0; its own adjoint, so backward is the same exchange."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
            ctx.group = group
            x = x.contiguous()  # before empty_like, which keeps strides: the collective writes flat memory
            out = torch.empty_like(x)
            dist.all_to_all_single(out, x, group=group)
            return out

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            grad = grad.contiguous()
            out = torch.empty_like(grad)
            dist.all_to_all_single(out, grad, group=ctx.group)
            return out, None

    return _AllToAll


def _gather_fn() -> type:
    import torch
    import torch.distributed as dist

    class _GatherSequence(torch.autograd.Function):
        """All-gather along dim 0; backward returns this rank's slice (all ranks share the loss)."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
            size, rank = dist.get_world_size(group), dist.get_rank(group)
            ctx.slice = (rank * x.shape[0], (rank + 1) * x.shape[0])
            x = x.contiguous()
            parts = [torch.empty_like(x) for _ in range(size)]
            dist.all_gather(parts, x, group=group)
            return torch.cat(parts)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            start, end = ctx.slice
            return grad[start:end].contiguous(), None

    return _GatherSequence


_FUNCS: dict[str, type] = {}


def _fn(name: str) -> type:
    if name not in _FUNCS:
        _FUNCS[name] = {"a2a": _all_to_all_fn, "gather": _gather_fn}[name]()
    return _FUNCS[name]


def gather_sequence(local: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Concatenate every rank's slice ``[N]`` into ``[sp * N]`` (differentiable, see module doc)."""
    return _fn("gather").apply(local, group)


def _seq_to_heads(tensors: list[torch.Tensor], group: ProcessGroup, sp: int) -> list[torch.Tensor]:
    """Each ``[B, H_i, S/sp, D]`` (all heads, my tokens) -> ``[B, H_i/sp, S, D]`` (my heads, all tokens).

    q, k and v travel in ONE all-to-all: separate exchanges would be independent branches of the
    autograd graph, whose backward collectives ranks may run in different orders (and so pair k on
    one rank with v on another).
    """
    import torch

    b, _, s, d = tensors[0].shape
    heads = [t.shape[1] // sp for t in tensors]
    chunks = torch.cat([t.reshape(b, sp, h, s, d) for t, h in zip(tensors, heads)], dim=2)
    out = _fn("a2a").apply(chunks.permute(1, 0, 2, 3, 4).contiguous(), group)  # [sp, B, sum(h), S/sp, D]
    full = out.permute(1, 2, 0, 3, 4).reshape(b, sum(heads), sp * s, d)
    return list(torch.split(full, heads, dim=1))


def _heads_to_seq(x: torch.Tensor, group: ProcessGroup, sp: int) -> torch.Tensor:
    """``[B, H/sp, S, D]`` -> ``[B, H, S/sp, D]`` (inverse of :func:`_seq_to_heads`)."""
    b, h, s, d = x.shape
    chunks = x.reshape(b, h, sp, s // sp, d).permute(2, 0, 1, 3, 4)
    out = _fn("a2a").apply(chunks.contiguous(), group)
    return out.permute(1, 0, 2, 3, 4).reshape(b, h * sp, s // sp, d)


def ulysses_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: ``[B, H, S/sp, D]`` inputs, ``[B, S/sp, H, D]`` output."""
    group = kwargs.get(SP_GROUP_KWARG)
    cu = kwargs.get("cu_seq_lens_q")
    if group is None or cu is None:
        raise EngineError(f"{ULYSSES_ATTN} attention needs {SP_GROUP_KWARG} and cu_seq_lens_q in the model kwargs")
    sp = group.size()
    n_q, n_kv = query.shape[1], key.shape[1]
    if n_q % sp != 0:
        raise EngineError(f"sequence parallel size {sp} must divide the number of attention heads per rank {n_q}")
    if n_kv % sp != 0:  # too few KV heads to split: replicate them up to the query heads
        key, value = repeat_heads(key, n_q // n_kv), repeat_heads(value, n_q // n_kv)
    q, k, v = _seq_to_heads([query, key, value], group, sp)
    out = packed_attention(
        q,
        k,
        v,
        cu,
        bounds=kwargs.get(BOUNDS_KWARG),
        max_len=kwargs.get("max_length_q"),
        scaling=scaling,
        dropout=dropout if module.training else 0.0,
        sliding_window=sliding_window,
    )
    out = _heads_to_seq(out, group, sp)
    return out.transpose(1, 2).contiguous(), None


def register_ulysses_attention() -> str:
    """Register the Ulysses attention with transformers (no mask builder); returns its name."""
    global _registered
    if not _registered:
        register_attention(ULYSSES_ATTN, ulysses_attention_forward)
        _registered = True
    return ULYSSES_ATTN
