"""The sampled decode step's draw as one Triton kernel (CUDA): temperature, top-k, top-p and min-p
without sorting the vocabulary, the token's logprob in the same launch.

One program per row streams the row's logits from global memory a fixed number of times and never
writes a ``[B, V]`` temporary (the torch form, :func:`~.sampling_kernels.draw_rows`, materialises
fp32 probabilities, keys and masks at every step of its search: 3.9 ms a step at batch 256 x
151,936 on an H200, compiled). The passes over a row:

1. **Soft-max statistics**: the running maximum and sum of ``exp(logits / T)`` (the row's
   log-sum-exp), the argmax (first index on ties: greedy rows stop here), and the range of the
   logits' order keys (:func:`~.sampling_kernels.order_keys`, computed in registers).
2. **Threshold search** (rows that filter by top-k or top-p): the same predicate and the same
   bracket as :func:`~.sampling_kernels.threshold_keys`, "fewer than ``k`` tokens and at most
   ``top_p`` of the mass lie strictly above the key", evaluated at ``FAN_OUT`` points of the
   bracket per pass (a count and a masked sum per point, all from one read of the row; counts only
   when a row of the batch filters by top-k, masses only when one does by top-p), until the bracket
   is one key wide: 3 or 4 passes for the 16-bit keys of bf16/fp16 logits (the row's key range
   sets the number), up to 8 for fp32. The counts at the bracket's ends give the number of tokens
   above the final threshold and tied on it; the tie rule of :func:`~.sampling_kernels.kept_mask`
   (as many tied tokens as the rank and mass rules allow, lowest indices first) then needs the
   index of the last tied token kept, found by a scan over the row only where part of the ties is
   kept.
3. **Draw** by an exponential race: each kept token ``i`` gets ``E_i ~ Exp(1)`` from Philox
   (``tl.rand`` keyed by the row's seed and the token's index) and the token with the largest
   ``log p_i - log E_i`` wins, which picks ``i`` with probability ``p_i / sum(kept p)`` (the
   minimum of independent exponentials of rates ``p_i``): no cumulative sum, no second pass for
   the kept mass. Min-p is a comparison with the row's top probability. ``E`` is computed as
   ``-log1p(-u)`` (``u`` itself where it is small, so the likeliest winners keep their precision).

The result is the distribution the sorted filter draws from (``tests/gpu/test_sampling_gpu.py``
tests the kept sets, the draws' distribution and ``top_k = 1`` against greedy). A given seed draws
a different token than the torch form's inverse CDF for the same request: both are exact, their
randomness differs. The returned logprob is the server's, ``log_softmax(logits / T)`` at the
token, before any filtering. No value is read back to the host and every launch has a fixed
shape, so the kernel runs inside CUDA graphs. Triton is imported lazily: :func:`kernel_available`
is False without it (the CPU build of torch) and the sampler keeps the torch form there.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch

from areal_tasks.errors import InferenceError
from areal_tasks.models.compile import triton_on_cuda

__all__ = ["BLOCK", "FAN_OUT", "NUM_WARPS", "SEARCH_BLOCK", "kernel_available", "kernel_fits", "triton_draw"]

#: logits per loop iteration (the search's own, whose accumulators are FAN_OUT times wider), search
#: points per pass, and warps per program: measured on an H200 at batch 256 x 151,936
#: (benchmarks/sampling_kernels.py; docs/benchmarks.md, "The Triton kernel").
BLOCK = 4096
SEARCH_BLOCK = 512
FAN_OUT = 16
NUM_WARPS = 16

_KEY_BITS = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}


def kernel_available() -> bool:
    """True when Triton imports and a CUDA device is present."""
    return triton_on_cuda()


def kernel_fits(logits: torch.Tensor) -> bool:
    """Whether :func:`triton_draw` takes these logits (CUDA, bf16/fp16/fp32, rows of unit stride)."""
    return logits.is_cuda and logits.dim() == 2 and logits.dtype in _KEY_BITS and logits.stride(-1) == 1


@functools.cache
def _kernel() -> Any:
    from areal_tasks.inference.server.sampling_triton_kernel import sample_rows_kernel

    return sample_rows_kernel


def triton_draw(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    greedy: torch.Tensor,
    seeds: torch.Tensor,
    filtered: bool = True,
    top_k_rows: bool = True,
    top_p_rows: bool = True,
    block: int = BLOCK,
    fan_out: int = FAN_OUT,
    search_block: int = SEARCH_BLOCK,
    num_warps: int = NUM_WARPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [B, V] (CUDA; bf16, fp16 or fp32); returns (token ids
    [B] int64, logprobs [B] float32). The per-row settings are those of
    :func:`~.sampling_kernels.draw_rows` ([B] tensors on the logits' device: ``temperatures`` (1 for
    greedy rows), ``top_ks`` (int64, ``>= V`` for none), ``top_ps``, ``min_ps``, ``greedy`` (bool))
    and ``seeds`` ([B] int64: each row's Philox key; the same seed and logits draw the same token).
    ``filtered=False`` leaves the threshold search out of the kernel (no row filters by top-k or
    top-p); ``top_k_rows=False`` / ``top_p_rows=False`` leave out its counts / its masses (no row
    filters by top-k / by top-p: the host knows, from the requests). ``block``, ``fan_out``,
    ``search_block`` and ``num_warps`` tune the kernel; the defaults were measured."""
    if not kernel_fits(logits):
        raise InferenceError(
            f"triton_draw takes [B, V] CUDA logits of bf16, fp16 or fp32 with unit stride rows, got "
            f"{tuple(logits.shape)} {logits.dtype} on {logits.device}; use sampling_kernels.draw_rows instead"
        )
    if fan_out < 2 or fan_out & (fan_out - 1):
        raise InferenceError(f"fan_out must be a power of two of at least 2, got {fan_out}")
    rows, vocab = logits.shape
    key_bits = _KEY_BITS[logits.dtype]
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return tokens, logprobs
    with torch.cuda.device(logits.device) if logits.is_cuda else contextlib.nullcontext():
        _kernel()[(rows,)](
            logits,
            logits.stride(0),
            vocab,
            temperatures.float().contiguous(),
            top_ks.long().contiguous(),
            top_ps.float().contiguous(),
            min_ps.float().contiguous(),
            greedy.to(torch.int8).contiguous(),
            seeds.long().contiguous(),
            tokens,
            logprobs,
            FILTERED=filtered,
            KEY_BITS=key_bits,
            TOP_K_ROWS=top_k_rows,
            TOP_P_ROWS=top_p_rows,
            FAN=fan_out,
            BLOCK_V=block,
            SEARCH_BLOCK=search_block,
            num_warps=num_warps,
        )
    return tokens, logprobs
