"""The cuDNN varlen attention's plumbing on the CPU: its two custom ops, their fake
implementations and autograd formula, under eager autograd and a full-graph compile. The aten
calls (CUDA-only) are swapped for a per-sequence SDPA reference that returns what cuDNN's ragged
path returns (``[T, H, Dv]`` output, ``[T, H, 1]`` fp32 soft-max statistics); the kernels
themselves are checked against torch's flash kernel in ``tests/gpu/test_cudnn_attention_gpu.py``."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.engine.fsdp import cudnn_attention
from areal_tasks.engine.fsdp.attention import VARLEN_CUDNN_ATTN, packed_attention, packed_kernel
from areal_tasks.engine.fsdp.build import _attn_implementation
from areal_tasks.errors import EngineError

BOUNDS = (0, 5, 12, 13, 20)
H, HKV, D = 4, 2, 8


def _reference(q, k, v, cu, max_len, scale):
    """Per-sequence causal attention: ``[T, H, D]`` out and ``[T, H, 1]`` log-sum-exp."""
    outs, stats = [], []
    rep = q.shape[1] // k.shape[1]
    for a, b in zip(cu.tolist(), cu.tolist()[1:]):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        scores = (qs @ ks.transpose(1, 2)) * scale
        scores = scores.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((scores.softmax(-1) @ vs).transpose(0, 1))
        stats.append(scores.logsumexp(-1).transpose(0, 1).unsqueeze(-1))
    return torch.cat(outs), torch.cat(stats).float()


def _fake_forward(q, k, v, cu, max_len, scale):
    with torch.no_grad():
        return _reference(q, k, v, cu, max_len, scale)


def _fake_backward(grad, q, k, v, out, stats, cu, max_len, scale):
    """The attention's gradients by the closed-form formulas (a custom op's implementation runs
    below autograd, so it cannot differentiate a reference)."""
    rep = q.shape[1] // k.shape[1]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for a, b in zip(cu.tolist(), cu.tolist()[1:]):
        qs, ks, vs, gs, os_ = (t[a:b].transpose(0, 1) for t in (q, k, v, grad, out))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        scores = (qs @ ks.transpose(1, 2)) * scale
        probs = scores.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        dprobs = gs @ vs.transpose(1, 2)
        dscores = probs * (dprobs - (gs * os_).sum(-1, keepdim=True))
        dq[a:b] = (dscores @ ks * scale).transpose(0, 1)
        dk_full = (dscores.transpose(1, 2) @ qs * scale)
        dv_full = probs.transpose(1, 2) @ gs
        dk[a:b] = dk_full.unflatten(0, (-1, rep)).sum(1).transpose(0, 1)
        dv[a:b] = dv_full.unflatten(0, (-1, rep)).sum(1).transpose(0, 1)
    return dq, dk, dv


@pytest.fixture
def cpu_cudnn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cudnn_attention, "_aten_forward", _fake_forward)
    monkeypatch.setattr(cudnn_attention, "_aten_backward", _fake_backward)
    cudnn_attention.register_cudnn_ops()


def _inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    total = BOUNDS[-1]
    return tuple(torch.randn(total, h, D, generator=gen, requires_grad=True) for h in (H, HKV, HKV))


def _per_sequence(q, k, v):
    """The engine's CPU path (one SDPA call per sequence), token-major in and out."""
    out = packed_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                           torch.tensor(BOUNDS, dtype=torch.int32), bounds=BOUNDS, scaling=0.3)
    return out[0].transpose(0, 1)


def _grads(fn, inputs):
    out = fn(*inputs)
    upstream = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    return out.detach(), torch.autograd.grad((out * upstream).sum(), inputs)


@pytest.mark.usefixtures("cpu_cudnn")
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_custom_ops_match_the_per_sequence_attention_in_outputs_and_gradients(compiled: bool) -> None:
    cu = torch.tensor(BOUNDS, dtype=torch.int32)

    def cudnn(q, k, v):
        return cudnn_attention.cudnn_varlen_packed(q, k, v, cu, 7, scaling=0.3)

    fn = torch.compile(cudnn, fullgraph=True, backend="aot_eager") if compiled else cudnn
    out, grads = _grads(fn, _inputs())
    ref_out, ref_grads = _grads(_per_sequence, _inputs())
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("cpu_cudnn")
def test_statistics_of_another_layout_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def transposed(*args):
        out, stats = _fake_forward(*args)
        return out, stats[..., 0].t().contiguous()  # [H, T], as the flash kernel lays them out

    monkeypatch.setattr(cudnn_attention, "_aten_forward", transposed)
    q, k, v = _inputs()
    with pytest.raises(EngineError, match=r"soft-max statistics of shape \(4, 20\).*areal_varlen"):
        cudnn_attention.cudnn_varlen_packed(q, k, v, torch.tensor(BOUNDS, dtype=torch.int32), 7)


def test_cudnn_is_refused_off_cuda_with_the_alternative_named() -> None:
    q = torch.randn(1, H, 4, D)
    with pytest.raises(EngineError, match="needs CUDA.*use 'areal_varlen'"):
        packed_kernel(q, prefer="cudnn")
    with pytest.raises(EngineError, match="needs CUDA and sp=1"):
        _attn_implementation(VARLEN_CUDNN_ATTN, 1, torch.device("cpu"))


def test_query_heads_must_be_a_multiple_of_key_value_heads() -> None:
    q, k, v = torch.randn(4, 3, D), torch.randn(4, 2, D), torch.randn(4, 2, D)
    with pytest.raises(EngineError, match="3 query heads are not a multiple of 2"):
        cudnn_attention.cudnn_varlen_packed(q, k, v, torch.tensor([0, 4], dtype=torch.int32), 4)
