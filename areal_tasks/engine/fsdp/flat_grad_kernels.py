"""One Triton kernel that adds a backward's per-parameter gradients into the flat fp32 master gradient.

:class:`~areal_tasks.engine.fsdp.flat_params.FlatParams` gets one compute-dtype gradient tensor per
parameter from each micro-batch's backward (290 for Qwen2.5-0.5B) and adds them into one flat fp32
buffer. In torch ops that is a batched concatenation into a flat compute-dtype buffer, then a
casting copy (the first micro-batch of a step) or a casting add (the others): for the 0.5B shape,
2 GB of traffic for the concatenation and 3 or 5 GB for the copy or add, and a ``reshape`` a
parameter on the host.

:func:`accumulate_into` does it in one pass: each program takes ``BLOCK`` elements of one
parameter's gradient, found through a device table of the gradients' addresses, and writes (or adds)
them in fp32 at that parameter's offset of the flat buffer: 3 GB for a copy, 5 GB for an add, one
launch (what it saved: docs/benchmarks_history.md, "Train throughput", eleventh session). A
parameter without a gradient (unused by the micro-batch) has address 0 and contributes zeros. The
block tables depend only on the parameters' sizes (:class:`BlockTable`, built once); the addresses
are new every backward and travel in one small non-blocking copy from pinned memory.

CUDA and Triton only (:func:`~areal_tasks.models.compile.triton_on_cuda`); ``FlatParams`` keeps the
torch-op path elsewhere, which is the reference the kernel is tested against (``tests/gpu``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from areal_tasks.errors import EngineError
from areal_tasks.models.compile import triton_on_cuda as kernels_available

__all__ = ["BLOCK", "BlockTable", "accumulate_into", "can_read", "kernels_available"]

#: gradient elements per program (and its warps): a 16 KB read of bf16 and 32 KB of fp32 each way.
BLOCK = 8192
WARPS = 8


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def accumulate_kernel(
        addresses_ptr,
        block_param_ptr,
        block_start_ptr,
        param_numel_ptr,
        param_offset_ptr,
        like_ptr,
        out_ptr,
        FRESH: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        block = tl.program_id(0)
        param = tl.load(block_param_ptr + block)
        start = tl.load(block_start_ptr + block)
        numel = tl.load(param_numel_ptr + param)
        offset = tl.load(param_offset_ptr + param)
        address = tl.load(addresses_ptr + param)
        index = start + tl.arange(0, BLOCK)
        inside = index < numel
        source = address.to(like_ptr.dtype)  # the gradient's address as a pointer of the compute dtype
        values = tl.load(source + index, mask=inside & (address != 0), other=0.0).to(tl.float32)
        if not FRESH:
            values += tl.load(out_ptr + offset + index, mask=inside)
        tl.store(out_ptr + offset + index, values, mask=inside)

    return accumulate_kernel


class BlockTable:
    """Which parameter, and where in it, each program of :func:`accumulate_into` covers, for
    parameters of ``sizes`` elements laid out one after another on ``device``."""

    def __init__(self, sizes: list[int], device: torch.device) -> None:
        if not sizes or any(size < 0 for size in sizes):
            raise EngineError(f"BlockTable needs parameter sizes >= 0, got {len(sizes)} of them")
        blocks = [-(-size // BLOCK) for size in sizes]
        counts = torch.tensor(blocks, dtype=torch.int64)
        self.params = len(sizes)
        self.blocks = int(counts.sum())
        starts = torch.tensor([0, *sizes[:-1]], dtype=torch.int64).cumsum(0)
        self.block_param = torch.repeat_interleave(torch.arange(len(sizes), dtype=torch.int32), counts).to(device)
        first_block = counts.cumsum(0) - counts
        within = torch.arange(self.blocks, dtype=torch.int64) - torch.repeat_interleave(first_block, counts)
        self.block_start = (within * BLOCK).to(device)
        self.param_numel = torch.tensor(sizes, dtype=torch.int64, device=device)
        self.param_offset = starts.to(device)
        self.total = sum(sizes)


def can_read(grad: torch.Tensor | None, like: torch.Tensor) -> bool:
    """Whether :func:`accumulate_into` takes ``grad``: None, or contiguous of ``like``'s dtype and device."""
    return grad is None or (grad.dtype == like.dtype and grad.device == like.device and grad.is_contiguous())


def accumulate_into(
    out: torch.Tensor, grads: list[torch.Tensor | None], table: BlockTable, like: torch.Tensor, *, fresh: bool
) -> None:
    """``out[offset_i : offset_i + n_i] (+)= grads[i]`` in fp32 for every parameter ``i`` of
    ``table``, in one kernel; ``fresh`` writes instead of adding. Each gradient must be contiguous
    and of ``like``'s dtype and device (``None``: zeros). Queued on the current stream; the
    gradients may be dropped right after (the caching allocator reuses their memory in stream
    order)."""
    if out.dtype != torch.float32 or out.numel() != table.total or not out.is_contiguous() or not out.is_cuda:
        raise EngineError(
            f"accumulate_into: out must be a contiguous CUDA fp32 buffer of {table.total} elements, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if len(grads) != table.params:
        raise EngineError(f"accumulate_into: {len(grads)} gradients for {table.params} parameters")
    addresses = []
    for index, grad in enumerate(grads):
        if grad is None:
            addresses.append(0)
            continue
        if not can_read(grad, like):
            raise EngineError(
                f"accumulate_into: gradient {index} is {grad.dtype}, strides {grad.stride()} on "
                f"{grad.device}; the kernel reads contiguous {like.dtype} on {like.device}"
            )
        addresses.append(grad.data_ptr())
    # pinned and non-blocking: a pageable copy would wait for everything queued on the stream
    table_of_addresses = torch.tensor(addresses, dtype=torch.int64).pin_memory().to(out.device, non_blocking=True)
    if table.blocks:
        with torch.cuda.device(out.device):
            _kernel()[(table.blocks,)](
                table_of_addresses,
                table.block_param,
                table.block_start,
                table.param_numel,
                table.param_offset,
                like,
                out,
                FRESH=fresh,
                BLOCK=BLOCK,
                num_warps=WARPS,
            )
