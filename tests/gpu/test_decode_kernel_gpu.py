"""The Triton grouped decode attention of the embedded server on a CUDA GPU (skipped without CUDA).

The kernel (``inference/server/decode_kernel.py``) against the fp32 PyTorch product it replaces:
bf16 inputs (and fp32 ones, to fp32 rounding) read from strided slot-cache views, boolean, additive
and no masks, KV lengths that are and are not multiples of the kernel's block, group sizes of the
Qwen2.5 shapes (7) and of plain multi-query layouts; then the same call inside ``torch.compile`` and
a captured CUDA graph, as the decode steps run it. Tolerances are bf16's.
"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.inference.server.decode_kernel import decode_attention, kernel_available, reference_decode_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not kernel_available(), reason="needs CUDA and triton")]


def inputs(
    batch: int,
    kv_heads: int,
    group: int,
    length: int,
    head_dim: int = 64,
    max_len: int = 640,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[torch.Tensor, ...]:
    """Grouped queries and keys/values as views of a ``[2, B, H_kv, max_len, D]`` store, with
    per-row fill lengths between 1 and ``length``."""
    gen = torch.Generator(device="cuda").manual_seed(length * 31 + group)
    store = torch.randn(2, batch, kv_heads, max_len, head_dim, device="cuda", dtype=dtype, generator=gen)
    key, value = store[0, :, :, :length], store[1, :, :, :length]
    query = torch.randn(batch, kv_heads, group, head_dim, device="cuda", dtype=dtype, generator=gen)
    filled = torch.randint(1, length + 1, (batch,), device="cuda", generator=gen)
    filled[0] = length
    allowed = torch.arange(length, device="cuda").view(1, 1, 1, -1) < filled.view(-1, 1, 1, 1)
    return query, key, value, allowed


@pytest.mark.parametrize("length", [1, 63, 64, 200, 513])
@pytest.mark.parametrize("group", [7, 1, 16])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_kernel_matches_the_fp32_product(length: int, group: int, mask_kind: str) -> None:
    query, key, value, allowed = inputs(batch=9, kv_heads=2, group=group, length=length)
    mask = {
        "bool": allowed,
        "none": None,
        "additive": torch.zeros(allowed.shape, device="cuda", dtype=query.dtype).masked_fill(~allowed, float("-inf")),
    }[mask_kind]
    scale = 0.125
    with torch.inference_mode():
        got = decode_attention(query, key, value, mask, scale)
    want = reference_decode_attention(
        query.float(), key.float(), value.float(), None if mask is None else allowed, scale
    )
    assert got.shape == query.shape and got.dtype == query.dtype
    assert (got.float() - want).abs().max().item() < 2e-2


@pytest.mark.parametrize("length", [1, 100, 513])
def test_fp32_kernel_is_exact_to_fp32_rounding(length: int) -> None:
    """fp32 inputs multiply without TF32: the kernel then agrees with the fp32 product closely
    enough for fp32 serving to match transformers token for token."""
    query, key, value, allowed = inputs(batch=5, kv_heads=2, group=7, length=length, dtype=torch.float32)
    with torch.inference_mode():
        got = decode_attention(query, key, value, allowed, 0.125)
    want = reference_decode_attention(query, key, value, allowed, 0.125)
    assert (got - want).abs().max().item() < 1e-5


def test_kernel_inside_compile_and_a_cuda_graph() -> None:
    query, key, value, allowed = inputs(batch=32, kv_heads=2, group=7, length=300, head_dim=128)
    additive = torch.zeros(allowed.shape, device="cuda", dtype=query.dtype).masked_fill(~allowed, float("-inf"))

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return decode_attention(q * 1.0, k, v, m, 0.1) + 1.0

    compiled = torch.compile(step, dynamic=True, fullgraph=True)  # the custom op does not break the graph
    with torch.inference_mode():
        eager = step(query, key, value, additive)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            compiled(query, key, value, additive)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = compiled(query, key, value, additive)
        query.copy_(torch.randn_like(query))  # replay reads the new inputs
        graph.replay()
        torch.cuda.synchronize()
        fresh = step(query, key, value, additive)
    assert (captured.float() - fresh.float()).abs().max().item() < 2e-2
    assert (eager.float() - fresh.float()).abs().max().item() > 1e-3  # the queries did change
