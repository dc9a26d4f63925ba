"""Causal varlen flash attention with grouped key/value heads: two custom ops around torch's own
flash kernels (``aten::_flash_attention_forward`` / ``_backward``).

torch's flash kernels map each group of query heads onto its key/value head themselves, but
``torch.nn.attention.varlen.varlen_attn`` takes no ``enable_gqa`` before torch 2.12, so the engine
used to repeat the key/value heads up to the query heads first. Handing the kernels the grouped
heads as they are saves the repeated copies forward, the sum over the copies backward, and most of
the key/value memory the kernels read (``benchmarks/varlen_attention.py``; figures in
``docs/benchmarks.md``).

The ops are opaque to ``torch.compile`` (a fake implementation gives their output shapes), so a
compiled decoder block calls the kernels directly. Dropout and sliding windows are not handled
here (the caller keeps torch's op for those). Importing this module registers the ops; it needs
torch with CUDA flash attention to run them, not to import.
"""

from __future__ import annotations

import torch

from areal_tasks.errors import EngineError

__all__ = ["flash_varlen_gqa"]


@torch.library.custom_op("areal_tasks::flash_varlen_forward", mutates_args=())
def _forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse, _seed, _offset, _mask = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, 0.0, True, False, scale=scale
    )
    return out, lse


@_forward.register_fake
def _forward_fake(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    # the varlen kernel's log-sum-exp is [heads, tokens] in fp32
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("areal_tasks::flash_varlen_backward", mutates_args=())
def _backward_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_len: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # no dropout: the kernel reads neither random state (shaped as torch's own varlen op passes them)
    seed = torch.zeros((2,), dtype=torch.uint64, device=q.device)
    offset = torch.empty(0, device=q.device)
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        grad_out.contiguous(),
        q,
        k,
        v,
        out,
        lse,
        cu_seqlens,
        cu_seqlens,
        max_len,
        max_len,
        0.0,
        True,
        seed,
        offset,
        scale=scale,
    )
    return dq, dk, dv


@_backward_op.register_fake
def _backward_fake(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_len: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_len, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.max_len, ctx.scale = max_len, scale


def _backward(ctx, grad_out: torch.Tensor, _grad_lse: torch.Tensor):
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = _backward_op(grad_out, q, k, v, out, lse, cu_seqlens, ctx.max_len, ctx.scale)
    return dq, dk, dv, None, None, None


_forward.register_autograd(_backward, setup_context=_setup_context)


def flash_varlen_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int, scale: float
) -> torch.Tensor:
    """Causal attention within each packed sequence of token-major ``q`` ``[T, H, D]`` over ``k``/``v``
    ``[T, Hkv, D]`` (``H`` a multiple of ``Hkv``; CUDA, fp16/bf16); ``cu_seqlens`` int32 bounds."""
    if q.shape[1] % k.shape[1] != 0 or k.shape != v.shape:
        raise EngineError(
            f"flash_varlen_gqa: {q.shape[1]} query heads over key {tuple(k.shape)} and value "
            f"{tuple(v.shape)}: the key/value heads must match and divide the query heads"
        )
    return _forward(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens, max_len, float(scale))[0]
