"""The chunked LM head's soft-max work as Triton kernels (CUDA) that read a chunk's logits once.

:mod:`areal_tasks.kernels.lm_head` scores ``chunk`` positions at a time: a matmul writes the
chunk's bf16 logits ``[n, V]``, then element-wise work reduces them to three numbers a row
(forward) or turns them into their gradient (backward). The work is memory-bound, so its floor is
one read of the logits (and one write of the gradient). Compiled by Inductor with dynamic shapes,
the reduction makes several passes over each row, and every index is computed from a symbolic
vocabulary size (figures: ``docs/benchmarks.md``).

- :func:`forward_stats`: programs over ``(row, 32K columns of it)`` stream their columns once with
  an *online* soft-max: a running maximum ``m``, ``s = sum exp(z - m)`` and
  ``w = sum exp(z - m) (z - m)``, rescaled once a block when the maximum grows; a second
  small kernel folds a row's parts into ``log Z = M + log S``, the entropy ``log S - W / S`` (every
  term taken about the maximum, so logits far from zero lose no precision) and the label's
  log-prob from a single load of its logit. (One program a whole row kept too few loads in flight.)
- :func:`logit_grad`: programs over ``(row, block of the vocabulary)`` write ``dL/dz`` in the
  logits' dtype: ``g_logprob (onehot - p) - g_entropy p (z - log Z + H)``, over the temperature.

Both take and return what the pure functions of ``lm_head.py`` do (``chunk_forward_stats``,
``chunk_logit_grad``), which are the reference they are tested against (``tests/gpu``). Triton is
imported lazily: :func:`kernels_available` is False without CUDA or Triton, and the head keeps
the compiled (or eager) pure functions.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from areal_tasks.errors import EngineError
from areal_tasks.models.compile import triton_on_cuda as kernels_available

__all__ = ["FORWARD_BLOCK", "GRAD_BLOCK", "forward_stats", "kernels_available", "logit_grad", "logit_grad_in_place"]

#: vocabulary entries per program of the forward (a row is split over several: one program a row
#: left much of the memory bandwidth unused), per loop iteration, and its warps. The fastest of the
#: configurations ``benchmarks/lm_head_chunks.py`` tries (docs/benchmarks.md, "LM head").
FORWARD_SPLIT = 32768
FORWARD_BLOCK = 2048
FORWARD_WARPS = 4
#: vocabulary entries per program of the gradient kernel, and its warps.
GRAD_BLOCK = 4096
GRAD_WARPS = 8


@functools.cache
def _kernels() -> tuple[Any, Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def partial_stats_kernel(
        logits_ptr,
        best_ptr,
        total_ptr,
        weighted_ptr,
        vocab,
        row_stride,
        inv_temp,
        SPLITS: tl.constexpr,
        SPLIT: tl.constexpr,
        WITH_ENTROPY: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # one program per (row, SPLIT columns of it), BLOCK columns at a time: a running maximum m,
        # s = sum exp(z - m) and w = sum exp(z - m) (z - m), rescaled once a block when m grows (one
        # exp() an element; a per-element rescale made the kernel compute-bound). A split's first
        # block starts inside the row, so m is finite from the first block on.
        row = tl.program_id(0).to(tl.int64)
        split = tl.program_id(1)
        base = logits_ptr + row * row_stride
        span = tl.arange(0, BLOCK)
        best = float("-inf")
        total = 0.0
        weighted = 0.0
        for offset in range(0, SPLIT, BLOCK):
            cols = split * SPLIT + offset + span
            inside = cols < vocab
            z = tl.load(base + cols, mask=inside, other=float("-inf")).to(tl.float32) * inv_temp
            new_best = tl.maximum(best, tl.max(z, 0))
            rescale = tl.exp(best - new_best)
            probs = tl.exp(z - new_best)
            if WITH_ENTROPY:
                shift = tl.where(best == float("-inf"), 0.0, best - new_best)  # 0 while s = w = 0
                centred = tl.where(inside, probs * (z - new_best), 0.0)
                weighted = rescale * (weighted + shift * total) + tl.sum(centred, 0)
            total = total * rescale + tl.sum(probs, 0)
            best = new_best
        out = row * SPLITS + split
        tl.store(best_ptr + out, best)
        tl.store(total_ptr + out, total)
        if WITH_ENTROPY:
            tl.store(weighted_ptr + out, weighted)

    @triton.jit
    def combine_stats_kernel(
        logits_ptr,
        labels_ptr,
        best_ptr,
        total_ptr,
        weighted_ptr,
        log_z_ptr,
        logprob_ptr,
        entropy_ptr,
        row_stride,
        inv_temp,
        SPLITS: tl.constexpr,
        SPLITS_PAD: tl.constexpr,
        WITH_ENTROPY: tl.constexpr,
    ):
        # one program per row folds its splits: log Z = M + log S, H = log S - W / S (both about M)
        row = tl.program_id(0).to(tl.int64)
        parts = tl.arange(0, SPLITS_PAD)
        real = parts < SPLITS
        best = tl.load(best_ptr + row * SPLITS + parts, mask=real, other=float("-inf"))
        total = tl.load(total_ptr + row * SPLITS + parts, mask=real, other=0.0)
        row_best = tl.max(best, 0)
        scale = tl.where(best == float("-inf"), 0.0, tl.exp(best - row_best))
        row_total = tl.sum(total * scale, 0)
        log_z = row_best + tl.log(row_total)
        label = tl.load(labels_ptr + row)
        label_z = tl.load(logits_ptr + row * row_stride + label).to(tl.float32) * inv_temp
        tl.store(log_z_ptr + row, log_z)
        tl.store(logprob_ptr + row, label_z - log_z)
        if WITH_ENTROPY:
            weighted = tl.load(weighted_ptr + row * SPLITS + parts, mask=real, other=0.0)
            shift = tl.where(best == float("-inf"), 0.0, best - row_best)
            row_weighted = tl.sum(scale * (weighted + shift * total), 0)
            tl.store(entropy_ptr + row, tl.log(row_total) - row_weighted / row_total)

    @triton.jit
    def logit_grad_kernel(
        logits_ptr,
        grad_ptr,
        labels_ptr,
        log_z_ptr,
        entropy_ptr,
        g_logprob_ptr,
        g_entropy_ptr,
        vocab,
        row_stride,
        inv_temp,
        HAS_LOGPROB: tl.constexpr,
        HAS_ENTROPY: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab
        z = tl.load(logits_ptr + row * row_stride + cols, mask=inside, other=0.0).to(tl.float32) * inv_temp
        log_z = tl.load(log_z_ptr + row)
        probs = tl.exp(z - log_z)
        grad = tl.zeros([BLOCK], tl.float32)
        if HAS_ENTROPY:
            entropy = tl.load(entropy_ptr + row)
            g_entropy = tl.load(g_entropy_ptr + row).to(tl.float32)
            grad = grad - (z - log_z + entropy) * probs * g_entropy
        if HAS_LOGPROB:
            label = tl.load(labels_ptr + row)
            g_logprob = tl.load(g_logprob_ptr + row).to(tl.float32)
            grad = grad + (tl.where(cols == label, 1.0, 0.0) - probs) * g_logprob
        grad = grad * inv_temp
        tl.store(grad_ptr + row * row_stride + cols, grad.to(grad_ptr.dtype.element_ty), mask=inside)

    return partial_stats_kernel, combine_stats_kernel, logit_grad_kernel


def _check(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if logits.dim() != 2 or not logits.is_contiguous() or not logits.is_cuda:
        raise EngineError(
            f"LM-head kernels need contiguous CUDA logits [n, V], got {tuple(logits.shape)} "
            f"with strides {logits.stride()} on {logits.device}"
        )
    if labels.shape != logits.shape[:1]:
        raise EngineError(f"LM-head kernels: {labels.shape[0]} labels for {logits.shape[0]} rows")


def forward_stats(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log Z, log-prob of the label, entropy or an empty tensor)``, fp32 ``[n]`` each, of a chunk's
    ``[n, V]`` logits (the kernel version of ``lm_head.chunk_forward_stats``)."""
    _check(logits, labels)
    rows, vocab = logits.shape
    log_z = torch.empty(rows, dtype=torch.float32, device=logits.device)
    logprob = torch.empty_like(log_z)
    entropy = torch.empty_like(log_z) if with_entropy else log_z.new_empty(0)
    if rows:
        splits = _cdiv(vocab, FORWARD_SPLIT)
        best, total, weighted = torch.empty(3, rows, splits, dtype=torch.float32, device=logits.device)
        partial, combine, _ = _kernels()
        with torch.cuda.device(logits.device):
            partial[(rows, splits)](
                logits,
                best,
                total,
                weighted,
                vocab,
                logits.stride(0),
                1.0 / temperature,
                SPLITS=splits,
                SPLIT=FORWARD_SPLIT,
                WITH_ENTROPY=with_entropy,
                BLOCK=FORWARD_BLOCK,
                num_warps=FORWARD_WARPS,
            )
            combine[(rows,)](
                logits,
                labels.contiguous(),
                best,
                total,
                weighted,
                log_z,
                logprob,
                entropy if with_entropy else log_z,
                logits.stride(0),
                1.0 / temperature,
                SPLITS=splits,
                SPLITS_PAD=max(2, 1 << (splits - 1).bit_length()),
                WITH_ENTROPY=with_entropy,
                num_warps=1,
            )
    return log_z, logprob, entropy


def logit_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    log_z: torch.Tensor,
    entropy: torch.Tensor,
    g_logprob: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gradient with respect to a chunk's logits, in their dtype (the kernel version of
    ``lm_head.chunk_logit_grad``); ``entropy`` is only read when ``g_entropy`` is given. ``out``
    (contiguous, the logits' shape and dtype) receives it instead of a new tensor; it may be the
    logits themselves: each program reads its block before writing it."""
    _check(logits, labels)
    rows, vocab = logits.shape
    if out is not None and (
        out.shape != logits.shape or out.dtype != logits.dtype or not out.is_contiguous() or out.device != logits.device
    ):
        raise EngineError(
            f"logit_grad: out must be contiguous like the logits ({tuple(logits.shape)}, "
            f"{logits.dtype}), got {tuple(out.shape)}, {out.dtype}, strides {out.stride()}"
        )
    grad = torch.empty_like(logits) if out is None else out
    if g_logprob is None and g_entropy is None:
        return grad.zero_()
    if rows:
        grid = (rows, _cdiv(vocab, GRAD_BLOCK))
        with torch.cuda.device(logits.device):
            _kernels()[2][grid](
                logits,
                grad,
                labels.contiguous(),
                log_z.contiguous(),
                entropy.contiguous() if g_entropy is not None else log_z,
                # an upstream gradient may be an expanded scalar (stride 0: the gradient of a sum)
                g_logprob.contiguous() if g_logprob is not None else log_z,
                g_entropy.contiguous() if g_entropy is not None else log_z,
                vocab,
                logits.stride(0),
                1.0 / temperature,
                HAS_LOGPROB=g_logprob is not None,
                HAS_ENTROPY=g_entropy is not None,
                BLOCK=GRAD_BLOCK,
                num_warps=GRAD_WARPS,
            )
    return grad


def logit_grad_in_place(logits: torch.Tensor, *args: Any) -> torch.Tensor:
    """:func:`logit_grad` written over the logits (the kept-logits backward: no second ``[n, V]``
    buffer); returns them."""
    return logit_grad(logits, *args, out=logits)


def _cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints."""
    return -(-a // b)
