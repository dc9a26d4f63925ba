"""The sort-free sampler on a CUDA GPU (skipped without CUDA): exact, sync-free and capturable.

``sampling_kernels.draw_rows`` at the server's shape (batch 256, the Qwen2.5 vocabulary of 151,936,
bf16 logits) against the sorted filter it replaced: every drawn token is one the sort keeps, and on
fp32 logits (no ties) the kept sets are equal. It runs with CUDA's sync debug mode set to "error"
(any read-back to the host would raise), is captured in a CUDA graph eagerly and compiled (the
threshold search fused, the two scans eager) and replayed with new uniforms to the eager result, and 200,000 draws on a
12-token vocabulary follow the truncated distribution (total variation < 0.01, fixed seed). The
server's compiled picker (``GreedyPicker.draw``, dynamic shapes) agrees with the eager draw.
"""

from __future__ import annotations

import time

import pytest
import torch

from areal_tasks.inference.server.greedy import GreedyPicker
from areal_tasks.inference.server.sampling import TOP_K_ALL
from areal_tasks.inference.server.sampling_kernels import (
    draw_rows,
    kept_mask,
    order_keys,
    search_rounds,
    sorted_filter,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BATCH, VOCAB = 256, 151936


def _table(rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Mixed per-row settings: top-k, top-p, min-p, combinations, unfiltered and greedy rows."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    temperatures = torch.rand(rows, device="cuda", generator=gen) + 0.5
    top_ks = torch.randint(1, 2000, (rows,), device="cuda", generator=gen)
    top_ps = torch.rand(rows, device="cuda", generator=gen) * 0.9 + 0.1
    min_ps = torch.rand(rows, device="cuda", generator=gen) * 0.2
    top_ks[::3], top_ps[1::3], min_ps[2::3] = TOP_K_ALL, 1.0, 0.0
    top_ks[5::16], top_ps[5::16], min_ps[5::16] = TOP_K_ALL, 1.0, 0.0
    greedy = torch.zeros(rows, dtype=torch.bool, device="cuda")
    greedy[7::32] = True
    temperatures[greedy] = 1.0
    return temperatures, top_ks, top_ps, min_ps, greedy


def _logits(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(BATCH, VOCAB, device="cuda", generator=gen) * 2.0
    logits[:, :1500] += 6.0 * torch.rand(BATCH, 1500, device="cuda", generator=gen)
    return logits.to(dtype)


def _sorted_kept(logits: torch.Tensor, table: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    temperatures, top_ks, top_ps, min_ps, _ = table
    probs = torch.softmax(logits.float() / temperatures.view(-1, 1), dim=-1)
    weights, ids = sorted_filter(probs.clone(), top_ks, torch.where(top_ps >= 1, torch.inf, top_ps), min_ps)
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(1, ids, weights > 0), probs


def test_kept_sets_equal_the_sort_and_draws_stay_inside() -> None:
    table = _table(BATCH, 1)
    logits = _logits(torch.float32)
    reference, probs = _sorted_kept(logits, table)
    kept = kept_mask(order_keys(logits), probs, table[1], table[2], table[3], search_rounds(32))
    assert torch.equal(kept & (probs > 0), reference)
    half = _logits(torch.bfloat16)
    reference, probs = _sorted_kept(half, table)
    kept = kept_mask(order_keys(half), probs, table[1], table[2], table[3], search_rounds(16))
    assert torch.equal((kept & (probs > 0)).sum(-1), reference.sum(-1))  # ties: the same number kept
    uniforms = torch.rand(BATCH, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    tokens, logprobs = draw_rows(half, *table, uniforms)
    picked = tokens.view(-1, 1)
    assert kept.gather(1, picked).all()
    # a token outside the sort's set can only be one tied with the sort's last kept value
    boundary = torch.where(reference, half.float(), torch.inf).amin(-1, keepdim=True)
    outside = ~reference.gather(1, picked)
    assert torch.equal(half.float().gather(1, picked)[outside], boundary[outside])
    assert torch.equal(tokens[table[4]], half.float()[table[4]].argmax(-1))
    want = torch.log_softmax(half.float() / table[0].view(-1, 1), -1).gather(1, tokens.view(-1, 1)).view(-1)
    torch.testing.assert_close(logprobs, want, rtol=0, atol=1e-5)


def test_no_host_sync() -> None:
    table = _table(BATCH, 3)
    logits = _logits(torch.bfloat16, 3)
    uniforms = torch.rand(BATCH, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        draw_rows(logits, *table, uniforms)
        draw_rows(logits, *table, uniforms, filtered=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_captured_in_a_cuda_graph_replays_the_eager_draw(compiled: bool) -> None:
    table = _table(BATCH, 4)
    logits = _logits(torch.bfloat16, 4)
    uniforms = torch.rand(BATCH, device="cuda")
    fn = torch.compile(draw_rows, dynamic=False) if compiled else draw_rows
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(2):
            fn(logits, *table, uniforms)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        tokens, logprobs = fn(logits, *table, uniforms)
    for seed in range(3):
        uniforms.copy_(torch.rand(BATCH, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        want_tokens, want_logprobs = draw_rows(logits, *table, uniforms)
        assert torch.equal(tokens, want_tokens)
        torch.testing.assert_close(logprobs, want_logprobs, rtol=0, atol=1e-5)


def test_draws_follow_the_truncated_distribution_on_the_gpu() -> None:
    draws, vocab = 200_000, 12
    logits = torch.tensor([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45], device="cuda")
    batch = logits.expand(draws, vocab).to(torch.bfloat16)
    ones = torch.ones(draws, device="cuda")
    top_ks = torch.full((draws,), 6, device="cuda")
    top_ps, min_ps = ones * 0.85, ones * 0.02
    gen = torch.Generator(device="cuda").manual_seed(2026)
    greedy = torch.zeros(draws, dtype=torch.bool, device="cuda")
    tokens, _ = draw_rows(
        batch, ones * 0.9, top_ks, top_ps, min_ps, greedy, torch.rand(draws, device="cuda", generator=gen)
    )
    probs = torch.softmax(batch[:1].float() / 0.9, dim=-1)
    weights, ids = sorted_filter(probs, top_ks[:1], top_ps[:1], min_ps[:1])
    expected = torch.zeros(vocab, device="cuda").scatter_(0, ids[0], weights[0])
    expected = (expected / expected.sum()).double()
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert torch.equal(counts > 0, expected > 0)
    assert 0.5 * (counts / draws - expected).abs().sum().item() < 0.01


def test_compiled_picker_matches_the_eager_draw() -> None:
    picker = GreedyPicker(compiled=True)
    start = time.perf_counter()
    picker.warm_up_draw(VOCAB, torch.bfloat16, torch.device("cuda"))
    print(f"GreedyPicker.warm_up_draw: {time.perf_counter() - start:.1f} s (four compilations)")
    assert picker._draw is not None, "the compilation failed (logged above): the picker fell back to eager"
    for rows in (1, 3, BATCH):
        table = tuple(t[:rows] for t in _table(BATCH, 5))
        logits = _logits(torch.bfloat16, 5)[:rows]
        uniforms = torch.rand(rows, device="cuda")
        tokens, logprobs = picker.draw(logits, *table, uniforms)
        want_tokens, want_logprobs = draw_rows(logits, *table, uniforms)
        assert torch.equal(tokens, want_tokens)
        torch.testing.assert_close(logprobs, want_logprobs, rtol=0, atol=1e-5)
