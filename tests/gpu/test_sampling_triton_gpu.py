"""The Triton sampling kernel on a CUDA GPU (skipped without CUDA and Triton): exact, sync-free and
capturable.

``sampling_triton.triton_draw`` at the server's shape (batch 256, the Qwen2.5 vocabulary of 151,936)
against the torch search's kept sets (``sampling_kernels.kept_mask``, itself tested against the
sorted filter): every drawn token is kept, greedy rows and ``top_k = 1`` rows take the argmax, the
logprobs are ``log_softmax(logits / T)`` at the token; 200,000 draws on 12-token vocabularies (with
and without ties on the threshold value) follow the truncated distribution of the sorted filter
(total variation < 0.01, fixed seeds); a launch reads nothing back (CUDA's sync debug mode set to
"error"), is captured in a CUDA graph and replays the eager draw for the same seeds; the server's
sampler routes sampled batches to it.
"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.inference.server.greedy import GreedyPicker
from areal_tasks.inference.server.sampling import SamplingBatch, SamplingParams, sample
from areal_tasks.inference.server.sampling_kernels import kept_mask, order_keys, search_rounds, sorted_filter
from areal_tasks.inference.server.sampling_triton import kernel_available, triton_draw

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not kernel_available(), reason="needs CUDA and Triton")]

BATCH, VOCAB = 256, 151936
TOP_K_NONE = 1 << 30


def _table(rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Mixed per-row settings: top-k, top-p, min-p, combinations, unfiltered, top-k 1 and greedy rows."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    temperatures = torch.rand(rows, device="cuda", generator=gen) + 0.5
    top_ks = torch.randint(1, 2000, (rows,), device="cuda", generator=gen)
    top_ps = torch.rand(rows, device="cuda", generator=gen) * 0.9 + 0.1
    min_ps = torch.rand(rows, device="cuda", generator=gen) * 0.2
    top_ks[::3], top_ps[1::3], min_ps[2::3] = TOP_K_NONE, 1.0, 0.0
    top_ks[5::16], top_ps[5::16], min_ps[5::16] = TOP_K_NONE, 1.0, 0.0
    top_ks[9::32], top_ps[9::32] = 1, 1.0
    greedy = torch.zeros(rows, dtype=torch.bool, device="cuda")
    greedy[7::32] = True
    temperatures[greedy] = 1.0
    return temperatures, top_ks, top_ps, min_ps, greedy


def _logits(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(BATCH, VOCAB, device="cuda", generator=gen) * 2.0
    logits[:, :1500] += 6.0 * torch.rand(BATCH, 1500, device="cuda", generator=gen)
    return logits.to(dtype)


def _seeds(rows: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2**62, (rows,), device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_draws_are_kept_tokens_with_the_servers_logprobs(dtype: torch.dtype) -> None:
    table = _table(BATCH, 1)
    temperatures, top_ks, top_ps, min_ps, greedy = table
    logits = _logits(dtype, 1)
    probs = torch.softmax(logits.float() / temperatures.view(-1, 1), dim=-1)
    kept = kept_mask(
        order_keys(logits), probs, top_ks, top_ps, min_ps, search_rounds(16 if dtype != torch.float32 else 32)
    )
    for seed in range(4):
        tokens, logprobs = triton_draw(logits, *table, _seeds(BATCH, seed))
        assert kept.gather(1, tokens.view(-1, 1)).all()
        argmax_rows = greedy | (top_ks == 1)
        assert torch.equal(tokens[argmax_rows], logits.float()[argmax_rows].argmax(-1))
        want = torch.log_softmax(logits.float() / temperatures.view(-1, 1), -1).gather(1, tokens.view(-1, 1)).view(-1)
        torch.testing.assert_close(logprobs, want, rtol=0, atol=2e-5)


def test_top_k_one_is_greedy_at_the_servers_shape() -> None:
    logits = _logits(torch.bfloat16, 2)
    ones = torch.ones(BATCH, device="cuda")
    top_ks = torch.ones(BATCH, dtype=torch.long, device="cuda")
    no = torch.zeros(BATCH, dtype=torch.bool, device="cuda")
    tokens, _ = triton_draw(logits, ones * 0.7, top_ks, ones, ones * 0, no, _seeds(BATCH, 2))
    assert torch.equal(tokens, logits.float().argmax(-1))


CASES = {
    "mixed": ([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45], 6, 0.85, 0.02, 0.9),
    "top_k_ties": ([1.0, 1.0, 0.5, 1.0, 0.5, 0.5, -1.0, 1.0, 0.0, 0.5, -2.0, 0.0], 5, 0.8, 0.0, 1.0),
    "top_p_ties": ([1.0, 1.0, 0.5, 1.0, 0.5, 0.5, -1.0, 1.0, 0.0, 0.5, -2.0, 0.0], TOP_K_NONE, 0.5, 0.0, 1.0),
    "min_p_only": ([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45], TOP_K_NONE, 1.0, 0.3, 1.0),
    "plain": ([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45], TOP_K_NONE, 1.0, 0.0, 1.2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_draws_follow_the_sorted_filters_distribution(case: str) -> None:
    values, top_k, top_p, min_p, temperature = CASES[case]
    draws, vocab = 200_000, len(values)
    batch = torch.tensor(values, device="cuda").expand(draws, vocab).to(torch.bfloat16).contiguous()
    ones = torch.ones(draws, device="cuda")
    top_ks = torch.full((draws,), top_k, dtype=torch.long, device="cuda")
    no = torch.zeros(draws, dtype=torch.bool, device="cuda")
    tokens, _ = triton_draw(batch, ones * temperature, top_ks, ones * top_p, ones * min_p, no, _seeds(draws, 2026))
    probs = torch.softmax(batch[:1].float() / temperature, dim=-1)
    weights, ids = sorted_filter(probs, top_ks[:1], ones[:1] * top_p, ones[:1] * min_p)
    expected = torch.zeros(vocab, device="cuda").scatter_(0, ids[0], weights[0])
    expected = (expected / expected.sum()).double()
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert torch.equal(counts > 0, expected > 0)
    assert 0.5 * (counts / draws - expected).abs().sum().item() < 0.01


def test_no_host_sync_and_a_captured_graph_replays_the_eager_draw() -> None:
    table = _table(BATCH, 3)
    logits = _logits(torch.bfloat16, 3)
    seeds = _seeds(BATCH, 3)
    triton_draw(logits, *table, seeds)  # compiles the kernel before the checks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        triton_draw(logits, *table, seeds)
        triton_draw(logits, *table, seeds, filtered=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, logprobs = triton_draw(logits, *table, seeds)
    for seed in range(3):
        seeds.copy_(_seeds(BATCH, 10 + seed))
        graph.replay()
        want_tokens, want_logprobs = triton_draw(logits, *table, seeds)
        assert torch.equal(tokens, want_tokens)
        assert torch.equal(logprobs, want_logprobs)


def test_the_servers_sampler_draws_with_the_kernel() -> None:
    picker = GreedyPicker(compiled=False, kernel=True)
    logits = _logits(torch.bfloat16, 4)[:8]
    assert picker.draws_with_seeds(logits)
    params = [SamplingParams(temperature=1.0, top_p=0.9, sampling_seed=7)] * 4 + [SamplingParams(top_k=20)] * 4
    generators = [torch.Generator(device="cuda").manual_seed(7) for _ in range(4)] + [None] * 4
    batch = SamplingBatch.build(params, generators, torch.device("cuda"))
    tokens, _ = sample(logits, batch, picker)
    probs = torch.softmax(logits.float(), dim=-1)
    kept = kept_mask(order_keys(logits), probs, batch.top_ks, batch.top_ps, batch.min_ps, search_rounds(16))
    assert kept.gather(1, tokens.view(-1, 1)).all()
    # the seeded rows draw again what they drew, from fresh generators of the same seed
    again = [torch.Generator(device="cuda").manual_seed(7) for _ in range(4)] + [None] * 4
    tokens_again, _ = sample(logits, SamplingBatch.build(params, again, torch.device("cuda")), picker)
    assert torch.equal(tokens_again[:4], tokens[:4])


@pytest.mark.parametrize("kind", ["top_k", "top_p"])
def test_a_batch_specialised_kernel_draws_what_the_general_one_draws(kind: str) -> None:
    """The server leaves out the counts (no top-k row) or the masses (no top-p row): same draws."""
    logits = _logits(torch.bfloat16, 6)
    ones = torch.ones(BATCH, device="cuda")
    top_ks = torch.full((BATCH,), 50 if kind == "top_k" else TOP_K_NONE, dtype=torch.long, device="cuda")
    top_ps = ones * (0.9 if kind == "top_p" else 1.0)
    no = torch.zeros(BATCH, dtype=torch.bool, device="cuda")
    seeds = _seeds(BATCH, 6)
    general = triton_draw(logits, ones, top_ks, top_ps, ones * 0, no, seeds)
    special = triton_draw(
        logits, ones, top_ks, top_ps, ones * 0, no, seeds, top_k_rows=kind == "top_k", top_p_rows=kind == "top_p"
    )
    assert torch.equal(general[0], special[0]) and torch.equal(general[1], special[1])
