"""The engine's fast paths on a CUDA GPU (skipped without CUDA).

* torch's varlen flash kernel behind ``packed_attention`` (and so ``areal_varlen`` and Ulysses)
  equals the ``T x T`` block-mask SDPA reference in bf16, forward and backward, with GQA (14 query
  / 2 key-value heads, the Qwen2.5-0.5B shape), a sliding window and a non-default scale;
* a short bf16 train step of the engine with its defaults (``areal_varlen`` attention, chunked fused
  LM head split into several chunks) agrees with the engine on transformers' ``sdpa`` with full
  logits: log-probs, entropies, loss and gradients; a few steps lower the loss.

Tolerances are bf16's (relative norms of ~1e-2), not fp32's; the fp32 paths are covered by the CPU
tests and ``test_fsdp_gpu.py``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from engine_helpers import make_batch, token_mean_loss, token_weight
from launch import run_workers

pytestmark = pytest.mark.gpu

LENGTHS = (1, 37, 700, 2048, 5, 1500, 300, 64)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-12))


def _inputs(n_q: int, n_kv: int, head_dim: int = 64, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(LENGTHS)
    bounds = tuple(int(x) for x in torch.tensor((0, *LENGTHS)).cumsum(0).tolist())
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    q, k, v = (
        torch.randn(1, n, total, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
        for n in (n_q, n_kv, n_kv)
    )
    grad_out = torch.randn(1, n_q, total, head_dim, device="cuda", generator=gen, dtype=torch.bfloat16)
    return q, k, v, cu, bounds, grad_out


def _block_mask_reference(q, k, v, cu, window, scaling):
    """fp32 SDPA with the block-diagonal causal mask (the CPU path), on upcast copies."""
    from areal_tasks.kernels.attention import block_causal_mask, repeat_heads

    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    mask = block_causal_mask(cu, q.shape[2], window)
    out = torch.nn.functional.scaled_dot_product_attention(
        q32, repeat_heads(k32, rep), repeat_heads(v32, rep), attn_mask=mask, scale=scaling
    )
    return out, (q32, k32, v32)


@pytest.mark.parametrize("heads", [(14, 2), (8, 8)], ids=["gqa-14-2", "mha-8"])
@pytest.mark.parametrize("window", [None, 256], ids=["causal", "window256"])
@pytest.mark.parametrize("scaling", [None, 0.1], ids=["default-scale", "scale0.1"])
def test_varlen_matches_block_mask_sdpa(heads, window, scaling):
    from areal_tasks.kernels.attention import (
        flash_attn_installed,
        packed_attention,
        packed_kernel,
        varlen_api_available,
    )

    q, k, v, cu, bounds, grad_out = _inputs(*heads)
    kernel = packed_kernel(q, 0.0, window)
    if not flash_attn_installed():
        assert varlen_api_available(), f"torch {torch.__version__} has no usable torch.nn.attention.varlen"
        if window is None:
            assert kernel == "varlen"
    print(f"torch {torch.__version__}: kernel {kernel} for heads={heads} window={window}")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = packed_attention(q, k, v, cu, bounds=bounds, scaling=scaling, sliding_window=window)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    out.backward(grad_out)
    ref, leaves = _block_mask_reference(q, k, v, cu, window, scaling)
    ref.backward(grad_out.float())
    assert _rel(out, ref) < 1e-2, f"output differs: {_rel(out, ref)}"
    for name, got, want in zip("qkv", (q, k, v), leaves):
        assert got.grad.shape == want.shape
        assert _rel(got.grad, want.grad) < 2e-2, f"d{name} differs: {_rel(got.grad, want.grad)}"


def test_varlen_is_one_kernel_without_a_mask():
    """No ``T x T`` buffer: the varlen forward+backward of a 32K-token micro-batch stays below the
    1 GiB that the block-diagonal ``T x T`` bool mask alone would take (the masked SDPA's scores
    would add 2 GiB per head more). What it does take is the gradients, the output and its
    gradient, and the kernel's fp32 accumulators."""
    from areal_tasks.kernels.attention import flash_attn_installed, packed_attention, packed_kernel

    if flash_attn_installed():
        pytest.skip("flash-attn is installed: the engine uses it instead")
    total, heads, head_dim = 32768, (14, 2), 64
    q = torch.randn(1, heads[0], total, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, heads[1], total, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    bounds = tuple(range(0, total + 1, 4096))
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    assert packed_kernel(q) == "varlen"
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    packed_attention(q, k, v, cu, bounds=bounds).sum().backward()
    torch.cuda.synchronize()
    extra = (torch.cuda.max_memory_allocated() - base) / 2**20
    mask_mib = total * total / 2**20
    assert extra < mask_mib, f"varlen attention used {extra:.0f} MiB extra: as much as a {mask_mib:.0f} MiB T x T mask"


# ----------------------------------------------------------------------------------- engine step
def engine_step_worker(rank: int, world: int, out_dir: Path, model_dir: str) -> None:
    """bf16 forward, gradients and a few steps: default fast paths vs sdpa + full logits."""
    from workers_fsdp import build_engine, engine_config

    batch = make_batch(seed=0, n_seqs=12, vocab=200, min_len=3, max_len=300)
    result: dict = {}
    variants = {"fast": {}, "plain": {"attn_implementation": "sdpa", "chunked_lm_head": False}}
    for name, kwargs in variants.items():
        engine = build_engine(model_dir, engine_config(2, lr=3e-3, grad_clip=1.0), **kwargs)
        if engine.lm_head is not None:
            engine.lm_head.chunk = 64  # several chunks, a ragged last one
        result[f"{name}_kernels"] = engine.kernels
        result[f"{name}_forward"] = {
            k: v.float().cpu() for k, v in engine.forward_batch(batch, with_entropy=True).items()
        }
        result[f"{name}_stats"] = engine.accumulate_gradients(batch, token_mean_loss, token_weight)
        result[f"{name}_grads"] = {n: g.float().cpu() for n, g in engine.full_gradients().items()}
        engine.zero_grad()
        if name == "fast":
            torch.cuda.reset_peak_memory_stats()
            result["losses"] = [engine.train_batch(batch, token_mean_loss, token_weight)["loss"] for _ in range(8)]
            result["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        engine.destroy()
    if rank == 0:
        torch.save(result, out_dir / "result.pt")


def test_engine_train_step_fast_paths_match_plain(tiny_qwen2, tmp_path, monkeypatch):
    from areal_tasks.kernels.attention import flash_attn_installed

    here = str(Path(__file__).resolve().parent)  # this module is the worker, found by name there
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    run_workers(
        "test_varlen_attention_gpu:engine_step_worker",
        1,
        tmp_path,
        {"model_dir": str(tiny_qwen2)},
        backend="nccl",
        timeout_s=400,
    )
    res = torch.load(tmp_path / "result.pt", weights_only=False)
    print({k: res[k] for k in ("fast_kernels", "plain_kernels", "losses", "peak_mib")})
    expected_attn = "flash_attention_2" if flash_attn_installed() else "areal_varlen"
    assert res["fast_kernels"]["attention"] == expected_attn
    assert res["fast_kernels"]["lm_head"].startswith("chunked")
    assert {k: res["plain_kernels"][k] for k in ("attention", "lm_head")} == {
        "attention": "sdpa",
        "lm_head": "full logits",
    }
    for key in ("logprobs", "entropy"):
        diff = (res["fast_forward"][key] - res["plain_forward"][key]).abs().max()
        assert diff < 0.05, f"bf16 {key} of the fast paths differ from sdpa + full logits by {diff}"
    assert res["fast_stats"]["loss"] == pytest.approx(res["plain_stats"]["loss"], abs=0.02)
    fast, plain = res["fast_grads"], res["plain_grads"]
    assert fast.keys() == plain.keys()
    total = _rel(torch.cat([fast[n].flatten() for n in plain]), torch.cat([plain[n].flatten() for n in plain]))
    assert total < 0.05, f"bf16 gradients differ by a relative norm of {total}"
    losses = res["losses"]
    assert losses[-1] < losses[0] - 0.05, f"bf16 training did not lower the loss: {losses}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_weight_gradient_accumulates_in_fp32_on_cuda():
    """The chunked head's ``[V, H]`` weight gradient: bf16 chunk products summed in an fp32
    accumulator by one GEMM each (``addmm`` with ``out_dtype``) equal the fp32 sum of the products."""
    from areal_tasks.kernels.lm_head import accumulate_matmul

    gen = torch.Generator(device="cuda").manual_seed(0)
    acc = torch.zeros(4096, 896, device="cuda")
    want = torch.zeros(4096, 896, device="cuda", dtype=torch.float64)
    for _ in range(8):
        a = torch.randn(4096, 832, device="cuda", generator=gen).to(torch.bfloat16)
        b = torch.randn(832, 896, device="cuda", generator=gen).to(torch.bfloat16)
        accumulate_matmul(acc, a, b)
        want += a.double() @ b.double()
    assert acc.dtype == torch.float32
    assert (acc.double() - want).abs().max().item() < 1e-2 * want.abs().max().item() ** 0.5
