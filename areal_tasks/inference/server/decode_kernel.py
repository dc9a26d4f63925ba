"""Grouped-query decode attention as one Triton kernel (CUDA; bf16, fp16 or fp32), for the decode steps.

A decode step has one query per sequence and head. SDPA's fused kernels are built for long query
blocks; at one query they leave most of the GPU's memory bandwidth unused (cuDNN's kernel takes
several times the floor set by reading the keys and values once: ``benchmarks/decode_attention.py``;
docs/benchmarks.md, "Decode attention"). This kernel runs one program per sequence and key/value
head: it loads the ``g`` query heads that share that key/value head once, streams the row's keys and
values in blocks with an online soft-max (scores and sums in fp32, the probabilities rounded to the
values' dtype for the second product, as flash attention does), and writes the ``g`` outputs (fp32
inputs multiply in full fp32, without TF32 rounding, so fp32 serving keeps matching ``transformers``
token for token). The cache is read exactly once, in place: keys and values are strided views of the
slot cache, nothing is copied or repeated.

The mask is the one the model runner builds for the row (``[B, 1, 1, L]``), boolean or additive,
so sliding windows and per-row fill lengths need nothing of their own; or None (every position).

:func:`decode_attention` is a ``torch.library`` custom op, so ``torch.compile`` keeps it as one
opaque call inside the compiled decoder blocks and CUDA graphs capture its launch. Triton is
imported lazily: :func:`kernel_available` is False on a machine without it (the CPU build of
torch), and the serving attention then keeps SDPA.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from areal_tasks.models.compile import triton_on_cuda

__all__ = [
    "decode_attention",
    "kernel_available",
    "kernel_fits",
    "launch_decode_attention",
    "reference_decode_attention",
]

#: keys and values per loop iteration, and warps per program (measured on an H200: see benchmarks.md).
BLOCK = 64
NUM_WARPS = 4


def kernel_available() -> bool:
    """True when Triton imports and a CUDA device is present."""
    return triton_on_cuda()


def kernel_fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether :func:`decode_attention` takes these grouped inputs (``query [B, H_kv, g, D]``,
    ``key``/``value [B, H_kv, L, D]``, a mask covering the ``L`` positions); otherwise the caller
    keeps SDPA."""
    head_dim = query.shape[-1]
    return (
        query.is_cuda
        and query.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and key.dtype == value.dtype == query.dtype
        and value.shape == key.shape
        and head_dim in (16, 32, 64, 128, 256)
        and query.shape[2] <= 64
        and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
        and (
            mask is None
            or (
                mask.dim() == 4
                and mask.shape[1] == 1
                and mask.shape[2] == 1
                and mask.shape[0] in (1, query.shape[0])
                and mask.shape[3] >= key.shape[2]
            )
        )
    )


def reference_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """The same product in plain PyTorch (fp32): what the kernel is tested against."""
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    return torch.matmul(scores.softmax(dim=-1), value.float()).to(query.dtype)


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def grouped_decode_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        m_ptr,
        o_ptr,
        scale,
        kv_len,
        sq_b,
        sq_h,
        sq_g,
        sk_b,
        sk_h,
        sk_l,
        sv_b,
        sv_h,
        sv_l,
        sm_b,
        sm_l,
        so_b,
        so_h,
        so_g,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_L: tl.constexpr,
        MASK_KIND: tl.constexpr,  # 0: none, 1: boolean, 2: additive
        PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no TF32 rounding), else "tf32" (unused by 16-bit dots)
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        g = tl.arange(0, GROUP_PAD)
        d = tl.arange(0, HEAD_DIM)
        span = tl.arange(0, BLOCK_L)
        real = g < GROUP
        q = tl.load(q_ptr + row * sq_b + head * sq_h + g[:, None] * sq_g + d[None, :], mask=real[:, None], other=0.0)
        k_base = k_ptr + row * sk_b + head * sk_h
        v_base = v_ptr + row * sv_b + head * sv_h
        m_base = m_ptr + row * sm_b
        best = tl.full([GROUP_PAD], -1.0e30, tl.float32)
        total = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        for start in range(0, kv_len, BLOCK_L):
            pos = start + span
            inside = pos < kv_len
            k = tl.load(k_base + pos[:, None] * sk_l + d[None, :], mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            if MASK_KIND == 1:
                allowed = tl.load(m_base + pos * sm_l, mask=inside, other=0).to(tl.int1)
                scores = tl.where((allowed & inside)[None, :], scores, float("-inf"))
            elif MASK_KIND == 2:
                bias = tl.load(m_base + pos * sm_l, mask=inside, other=float("-inf")).to(tl.float32)
                scores = scores + bias[None, :]
            else:
                scores = tl.where(inside[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            rescale = tl.exp(best - new_best)
            probs = tl.exp(scores - new_best[:, None])
            total = total * rescale + tl.sum(probs, 1)
            v = tl.load(v_base + pos[:, None] * sv_l + d[None, :], mask=inside[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=PRECISION)
            best = new_best
        out = acc / total[:, None]
        tl.store(
            o_ptr + row * so_b + head * so_h + g[:, None] * so_g + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=real[:, None],
        )

    return grouped_decode_kernel


def launch_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    out: torch.Tensor,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
) -> None:
    """Run the kernel into ``out`` (shaped like ``query``) with ``block`` keys per iteration and
    ``num_warps`` warps per program; :func:`decode_attention` is this with the defaults."""
    batch, kv_heads, group, head_dim = query.shape
    kv_len = key.shape[2]
    if mask is None:
        kind, mask_arg, sm_b, sm_l = 0, query, 0, 0
    else:
        kind = 1 if mask.dtype == torch.bool else 2
        mask_arg, sm_b, sm_l = mask, mask.stride(0), mask.stride(3)
        if mask.shape[0] == 1:
            sm_b = 0
    group_pad = max(16, 1 << (group - 1).bit_length())
    current = torch.cuda.device(query.device) if query.is_cuda else contextlib.nullcontext()
    with current:
        _kernel()[(batch, kv_heads)](
            query,
            key,
            value,
            mask_arg,
            out,
            scale,
            kv_len,
            query.stride(0),
            query.stride(1),
            query.stride(2),
            key.stride(0),
            key.stride(1),
            key.stride(2),
            value.stride(0),
            value.stride(1),
            value.stride(2),
            sm_b,
            sm_l,
            out.stride(0),
            out.stride(1),
            out.stride(2),
            GROUP=group,
            GROUP_PAD=group_pad,
            HEAD_DIM=head_dim,
            BLOCK_L=block,
            MASK_KIND=kind,
            PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
            num_warps=num_warps,
        )


@torch.library.custom_op("areal_serve::grouped_decode_attention", mutates_args=())
def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Attention of ``query [B, H_kv, g, D]`` (the ``g`` query heads of each key/value head, one
    position each) over ``key``/``value [B, H_kv, L, D]`` under ``mask`` (``[B or 1, 1, 1, L]``,
    boolean or additive, or None); returns ``[B, H_kv, g, D]`` in the query's dtype."""
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    launch_decode_attention(query, key, value, mask, scale, out)
    return out


@decode_attention.register_fake
def _decode_attention_shape(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    return torch.empty(query.shape, dtype=query.dtype, device=query.device)
