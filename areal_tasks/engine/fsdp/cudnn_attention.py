"""Causal varlen attention by cuDNN's fused attention over ragged (packed) sequences.

torch ships cuDNN's fused attention for packed sequences as the aten ops
``_cudnn_attention_forward``/``_cudnn_attention_backward`` with ``cum_seq_q``/``cum_seq_k`` (its
nested-tensor path), but without a fake (meta) implementation, so a compiled decoder block cannot
trace them; and torch's own ``varlen_attn`` keeps its cuDNN branch switched off. This module wraps
the two ops as custom ops of its own (``areal::cudnn_varlen_fwd`` / ``areal::cudnn_varlen_bwd``)
with fake implementations and an autograd formula, so they run inside compiled blocks as one
opaque call each.

Layout: token-major ``[T, H, D]`` query and ``[T, Hkv, D]`` key/value (grouped-query attention is
passed through: cuDNN takes fewer key/value heads), ``cu_seqlens`` int32 ``[n + 1]``. The
forward's soft-max statistics are ``[T, H, 1]`` fp32, as torch's cuDNN path allocates them; the
forward checks that and raises :class:`~areal_tasks.errors.EngineError` otherwise, rather than
hand the backward something it would misread.

Selected with ``attn_implementation="areal_varlen_cudnn"`` (``attention.py``); the default stays
torch's flash kernel until the engine benchmark shows cuDNN faster (``benchmarks/varlen_attention.py``
times both on the benchmark's packed micro-batches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_HEAD_DIM", "cudnn_varlen_packed", "cudnn_varlen_supported", "register_cudnn_ops"]

#: largest head dimension cuDNN's ragged fused attention takes.
MAX_HEAD_DIM = 128

_ops: Any = None


def _aten_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's forward: (output ``[T, H, Dv]``, soft-max statistics)."""
    import torch

    result = torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu, cu, max_len, max_len, True, 0.0, True, False, scale=scale)
    return result[0], result[1]


def _aten_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   stats: torch.Tensor, cu: torch.Tensor, max_len: int,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cuDNN's backward: (dq, dk, dv). No dropout, so the philox seed and offset are never read."""
    import torch

    unused = torch.zeros((), dtype=torch.int64, device=q.device)
    return torch.ops.aten._cudnn_attention_backward(
        grad, q, k, v, out, stats, unused, unused, None, cu, cu, max_len, max_len, 0.0, True, scale=scale)


def register_cudnn_ops() -> Any:
    """Define the two custom ops (once; call it in eager code, before blocks are compiled) and
    return the forward op."""
    global _ops
    if _ops is not None:
        return _ops
    import torch

    # schemas spelled out: this module's annotations are strings (``from __future__ import
    # annotations``), which custom_op cannot read; max_len is a SymInt inside compiled blocks
    @torch.library.custom_op("areal::cudnn_varlen_fwd", mutates_args=(),
                             schema="(Tensor q, Tensor k, Tensor v, Tensor cu, SymInt max_len, float scale) "
                                    "-> (Tensor, Tensor)")
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out, stats = _aten_forward(q, k, v, cu, max_len, scale)
        expected = (q.shape[0], q.shape[1], 1)
        if tuple(stats.shape) != expected or stats.dtype != torch.float32:
            raise EngineError(f"cuDNN varlen attention returned soft-max statistics of shape {tuple(stats.shape)} "
                              f"({stats.dtype}), expected {expected} float32; this torch's cuDNN path differs: "
                              "use attn_implementation='areal_varlen' (torch's flash kernel)")
        return out.contiguous(), stats

    @forward.register_fake
    def _(q, k, v, cu, max_len, scale):
        return (q.new_empty(q.shape[0], q.shape[1], v.shape[2]),
                q.new_empty(q.shape[0], q.shape[1], 1, dtype=torch.float32))

    @torch.library.custom_op("areal::cudnn_varlen_bwd", mutates_args=(),
                             schema="(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor stats, "
                                    "Tensor cu, SymInt max_len, float scale) -> (Tensor, Tensor, Tensor)")
    def backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 stats: torch.Tensor, cu: torch.Tensor, max_len: int,
                 scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dq, dk, dv = _aten_backward(grad.contiguous(), q, k, v, out, stats, cu, max_len, scale)
        return dq.contiguous(), dk.contiguous(), dv.contiguous()

    @backward.register_fake
    def _(grad, q, k, v, out, stats, cu, max_len, scale):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def setup_context(ctx, inputs, output):
        q, k, v, cu, max_len, scale = inputs
        out, stats = output
        ctx.save_for_backward(q, k, v, out, stats, cu)
        ctx.max_len, ctx.scale = max_len, scale

    def grad_fn(ctx, grad_out, _grad_stats):
        q, k, v, out, stats, cu = ctx.saved_tensors
        dq, dk, dv = backward(grad_out, q, k, v, out, stats, cu, ctx.max_len, ctx.scale)
        return dq, dk, dv, None, None, None

    forward.register_autograd(grad_fn, setup_context=setup_context)
    _ops = forward
    return _ops


def cudnn_varlen_supported(q: torch.Tensor, dropout: float = 0.0, sliding_window: int | None = None) -> bool:
    """Whether :func:`cudnn_varlen_packed` can run on ``q``: CUDA with cuDNN, fp16/bf16, no dropout,
    no sliding window, head dimension a multiple of 8 up to :data:`MAX_HEAD_DIM`."""
    import torch

    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or dropout > 0.0 or sliding_window:
        return False
    return q.shape[-1] % 8 == 0 and q.shape[-1] <= MAX_HEAD_DIM and torch.backends.cudnn.is_available()


def cudnn_varlen_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                        *, scaling: float | None = None) -> torch.Tensor:
    """Causal attention within each packed sequence of token-major ``[T, H, D]`` tensors
    (``k``/``v``: ``[T, Hkv, D]``, ``H`` a multiple of ``Hkv``); returns ``[T, H, D]``."""
    import torch

    if q.shape[1] % k.shape[1] != 0:
        raise EngineError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads")
    scale = float(q.shape[-1] ** -0.5) if scaling is None else float(scaling)
    cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.to(torch.int32)
    if _ops is None:  # registered in eager code by attention.register_varlen_cudnn_attention
        raise EngineError("the cuDNN varlen attention ops are not registered: call register_cudnn_ops() first")
    out, _ = torch.ops.areal.cudnn_varlen_fwd(q.contiguous(), k.contiguous(), v.contiguous(), cu, max_len, scale)
    return out
