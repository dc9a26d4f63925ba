"""The archon decoder on a CUDA GPU in bf16 (skipped without CUDA).

The ``torch._grouped_mm`` expert kernel against the per-expert loop (forward and gradients, with
empty and unaligned groups), ``auto`` choosing it for bf16 on CUDA, and the decoder's per-token
log-probs and entropies against transformers' in bf16 (dense and MoE), at bf16 tolerances: the
archon error against the fp32 reference stays within a small multiple of transformers' own bf16 error.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from areal_tasks.engine.archon.model import build_decoder
from areal_tasks.engine.archon.model.experts import experts_forward, grouped_mm_available, resolve_kernel
from areal_tasks.kernels.logprobs import next_token_stats

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or not grouped_mm_available(), reason="needs CUDA"),
]


def _case(counts: tuple[int, ...], dim: int = 256, hidden: int = 512, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = len(counts)
    x = torch.randn(sum(counts), dim, generator=gen)
    ws = [torch.randn(s, generator=gen) * s[-1] ** -0.5 for s in ((n, hidden, dim), (n, hidden, dim), (n, dim, hidden))]
    grad = torch.randn(sum(counts), dim, generator=gen)
    return x, ws, grad


def _forward_backward(kernel, x, ws, grad, counts, dtype):
    leaves = [t.cuda().to(dtype).requires_grad_() for t in (x, *ws)]
    c = torch.tensor(counts, device="cuda") if kernel == "grouped_mm" else list(counts)
    y = experts_forward(leaves[0], c, *leaves[1:], kernel=kernel)
    grads = torch.autograd.grad(y, leaves, grad.cuda().to(dtype))
    return y.float(), [g.float() for g in grads]


@pytest.mark.parametrize("counts", [(128, 64, 256, 32), (7, 0, 300, 1, 45, 0, 16, 3), (0, 0, 5, 0)])
def test_grouped_mm_matches_loop_bf16(counts):
    x, ws, grad = _case(counts)
    y_ref, g_ref = _forward_backward("loop", x, ws, grad, counts, torch.float32)
    y_loop, g_loop = _forward_backward("loop", x, ws, grad, counts, torch.bfloat16)
    y_gmm, g_gmm = _forward_backward("grouped_mm", x, ws, grad, counts, torch.bfloat16)
    torch.testing.assert_close(y_gmm, y_loop, atol=3e-2, rtol=3e-2)
    for a, b in zip(g_gmm, g_loop):
        torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2)
    # no worse than the loop in bf16 against the fp32 result
    assert (y_gmm - y_ref).abs().max() <= 2 * (y_loop - y_ref).abs().max() + 1e-3
    for gmm, loop, ref in zip(g_gmm, g_loop, g_ref):
        assert (gmm - ref).abs().max() <= 2 * (loop - ref).abs().max() + 1e-3


def test_auto_kernel_is_grouped_mm_for_cuda_bf16():
    x = torch.zeros(1, 8, device="cuda", dtype=torch.bfloat16)
    assert resolve_kernel("auto", x) == "grouped_mm"
    assert resolve_kernel("auto", x.float()) == "loop"
    assert resolve_kernel("auto", x.cpu()) == "loop"


def _packed(lengths=(40, 97, 13, 64), vocab=1024):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (sum(lengths),), generator=gen)
    bounds = (0, *torch.cumsum(torch.tensor(lengths), 0).tolist())
    pos = torch.cat([torch.arange(n) for n in lengths])
    return ids, pos, bounds


def _hf_scores(hf, ids, bounds):
    rows = []
    for a, b in itertools.pairwise(bounds):
        seq = ids[a:b].cuda()
        logits = hf(input_ids=seq[None]).logits[0, :-1]
        rows.append(torch.stack(next_token_stats(logits, seq[1:], with_entropy=True), -1))
    return torch.cat(rows)


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe", "mixtral"])
def test_logprobs_match_transformers_bf16(family, tiny_model_factory):
    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_factory(family)
    model, args = build_decoder(model_dir, device="cuda", dtype=torch.bfloat16)
    ids, pos, bounds = _packed()
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[torch.tensor(bounds[1:]) - 1] = False
    with torch.no_grad():
        out = model(
            ids[None].cuda(),
            position_ids=pos[None].cuda(),
            cu_seqlens=torch.tensor(bounds, dtype=torch.int32, device="cuda"),
            bounds=bounds,
            labels=torch.roll(ids, -1)[None].cuda(),
        )
        out = (out[0] if args.is_moe else out)[0, keep.cuda()]
        ref32 = _hf_scores(
            AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).cuda(), ids, bounds
        )
        ref16 = _hf_scores(
            AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).cuda(), ids, bounds
        )
    torch.testing.assert_close(out, ref16, atol=0.1, rtol=0.02)
    assert (out - ref32).abs().max() <= 3 * (ref16 - ref32).abs().max() + 1e-2
