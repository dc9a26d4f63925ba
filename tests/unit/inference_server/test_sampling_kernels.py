"""The sort-free sampler (``sampling_kernels.py``) against the sorted filter it replaced.

Order keys order like the values; the threshold search ends on the exact kept set of SGLang's
sorted top-k / top-p / min-p filter (ties on the threshold: as many as a sort keeps, lowest indices
first); ``top_k = 1`` is greedy; and 200,000 draws per setting on a 12-token vocabulary (one row a
draw, a fixed seed, so the test is deterministic) match the truncated distribution computed
independently in float64 (``server_helpers.expected_probs``): never a filtered-out token, total
variation below 0.01 and a chi-square test at significance 1e-6, with each draw's logprob equal to
``log_softmax(logits / T)`` at its token.
"""

from __future__ import annotations

import pytest
import torch
from server_helpers import chi_square, chi_square_critical, expected_probs

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.greedy import GreedyPicker, greedy_pick
from areal_tasks.inference.server.sampling import TOP_K_ALL, SamplingBatch, SamplingParams, sample
from areal_tasks.inference.server.sampling_kernels import (
    draw_rows,
    kept_mask,
    order_keys,
    search_rounds,
    sorted_filter,
    threshold_keys,
)


def _settings(rows: int, params: SamplingParams) -> tuple[torch.Tensor, ...]:
    """(temperatures, top_ks, top_ps, min_ps, greedy) of ``rows`` rows of ``params``."""
    return (
        torch.full((rows,), params.temperature),
        torch.full((rows,), params.top_k if params.top_k > 0 else TOP_K_ALL, dtype=torch.long),
        torch.full((rows,), params.top_p),
        torch.full((rows,), params.min_p),
        torch.zeros(rows, dtype=torch.bool),
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_order_keys_order_like_the_values(dtype: torch.dtype) -> None:
    values = torch.randn(2000, generator=torch.Generator().manual_seed(0)) * 40
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-30, -1e-30, 3.0, 3.0])
    x = torch.cat([values, specials]).to(dtype)
    keys = order_keys(x)
    assert keys.dtype == torch.int32
    as_float = x.float()
    below = as_float.view(-1, 1) < as_float.view(1, -1)
    same = as_float.view(-1, 1) == as_float.view(1, -1)
    keys_below = keys.view(-1, 1) < keys.view(1, -1)
    keys_same = keys.view(-1, 1) == keys.view(1, -1)
    assert torch.equal(keys_below[~same], below[~same])  # different values: the same order
    zero = (as_float == 0).view(-1, 1) & (as_float == 0).view(1, -1)
    assert keys_same[same & ~zero].all()  # equal values: equal keys, but for +0.0 and -0.0,
    assert order_keys(torch.tensor([-0.0, 0.0], dtype=dtype)).tolist() == [-1, 0]  # next to each other
    assert (keys[as_float > 0] > 0).all() and (keys[as_float < 0] < 0).all()


def test_order_keys_refuse_other_dtypes() -> None:
    with pytest.raises(InferenceError, match="float64"):
        order_keys(torch.zeros(3, dtype=torch.float64))


def test_search_rounds_cover_the_key_width() -> None:
    assert (search_rounds(16), search_rounds(32)) == (8, 16)
    assert (search_rounds(16, fan_out=2), search_rounds(16, fan_out=8)) == (16, 6)
    with pytest.raises(InferenceError, match="fan_out"):
        search_rounds(16, fan_out=1)


def _sorted_kept(probs: torch.Tensor, top_ks, top_ps, min_ps) -> torch.Tensor:
    """The sorted filter's kept set; top_p = 1 is "no top-p" (the sorted filter's float cumsum may
    pass 1.0 and drop a tail of near-zero tokens there; the search does not filter such rows)."""
    no_top_p = torch.where(top_ps >= 1.0, torch.inf, top_ps)
    weights, ids = sorted_filter(probs.clone(), top_ks, no_top_p, min_ps)
    return torch.zeros_like(probs, dtype=torch.bool).scatter_(1, ids, weights > 0)


@pytest.mark.parametrize("fan_out", [2, 4, 8])
def test_kept_set_equals_the_sorted_filter(fan_out: int) -> None:
    gen = torch.Generator().manual_seed(fan_out)
    rows, vocab = 96, 257
    # fp32 logits over a wide range (keys spread over the whole 32-bit line), one row with -inf entries
    logits = torch.randn(rows, vocab, generator=gen) * torch.logspace(-2, 2, rows).view(-1, 1)
    logits[0, :100] = -float("inf")
    temperatures = torch.rand(rows, generator=gen) + 0.3
    probs = torch.softmax(logits / temperatures.view(-1, 1), dim=-1)
    top_ks = torch.randint(1, vocab + 10, (rows,), generator=gen)
    top_ps = torch.rand(rows, generator=gen) * 0.95 + 0.05
    min_ps = torch.rand(rows, generator=gen) * 0.3
    top_ks[::4], top_ps[1::4], min_ps[2::4] = TOP_K_ALL, 1.0, 0.0
    top_ks[3::8], top_ps[3::8], min_ps[3::8] = TOP_K_ALL, 1.0, 0.0  # rows that keep everything
    kept = kept_mask(order_keys(logits), probs, top_ks, top_ps, min_ps, search_rounds(32, fan_out), fan_out)
    # tokens of probability 0 (underflow) carry no weight either way: compared where p > 0
    assert torch.equal(kept & (probs > 0), _sorted_kept(probs, top_ks, top_ps, min_ps))
    assert kept[3::8].all()


def test_ties_on_the_threshold_keep_as_many_as_a_sort_lowest_indices_first() -> None:
    # bf16 logits with a block of equal values around the top-k / top-p boundary
    logits = torch.tensor([[4.0, 1.0, 2.0, 1.0, 1.0, 0.0, 1.0, 3.0]] * 3, dtype=torch.bfloat16)
    probs = torch.softmax(logits.float(), dim=-1)
    # row 0: top-k 4 keeps 4.0, 3.0, 2.0 and the first of the four 1.0s; row 1: top-p just above the
    # mass of the three largest plus two of the ties; row 2: min-p keeps every tie
    above3 = probs[0, [0, 7, 2]].sum().item()
    tie = probs[0, 1].item()
    top_ks = torch.tensor([4, TOP_K_ALL, TOP_K_ALL])
    top_ps = torch.tensor([1.0, above3 + 1.5 * tie, 1.0])
    min_ps = torch.tensor([0.0, 0.0, tie / probs[0, 0].item() * 0.999])
    kept = kept_mask(order_keys(logits), probs, top_ks, top_ps, min_ps, search_rounds(16))
    assert kept[0].nonzero().view(-1).tolist() == [0, 1, 2, 7]
    assert kept[1].nonzero().view(-1).tolist() == [0, 1, 2, 3, 7]
    assert kept[2].nonzero().view(-1).tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert torch.equal(kept.sum(-1), _sorted_kept(probs, top_ks, top_ps, min_ps).sum(-1))


def test_threshold_search_ends_on_the_kth_largest_key() -> None:
    logits = torch.randn(4, 1000, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    keys = order_keys(logits)
    top_ks = torch.tensor([1, 5, 50, 999])
    found = threshold_keys(keys, torch.softmax(logits.float(), -1), top_ks, torch.ones(4), search_rounds(16))
    want = torch.stack([keys[r].sort(descending=True).values[k - 1] for r, k in enumerate(top_ks.tolist())])
    assert torch.equal(found, want.long())


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_top_k_one_is_greedy(temperature: float) -> None:
    gen = torch.Generator().manual_seed(5)
    logits = (torch.randn(64, 300, generator=gen) * 2).to(torch.bfloat16)
    logits[:8, 10] = logits[:8, 20] = 9.0  # ties on the maximum: the first index, as argmax
    rows = logits.shape[0]
    temperatures = torch.full((rows,), temperature)
    tokens, logprobs = draw_rows(
        logits,
        temperatures,
        torch.ones(rows, dtype=torch.long),
        torch.full((rows,), 0.9),
        torch.zeros(rows),
        torch.zeros(rows, dtype=torch.bool),
        torch.rand(rows, generator=gen),
    )
    greedy_tokens, greedy_logprobs = greedy_pick(logits.float() / temperature)
    assert torch.equal(tokens, greedy_tokens) and (tokens[:8] == 10).all()
    torch.testing.assert_close(logprobs, greedy_logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.0, top_k=4),
        SamplingParams(temperature=1.2, top_p=0.7),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=0.9, top_k=6, top_p=0.85, min_p=0.02),
    ],
    ids=["temperature", "top_k", "top_p", "min_p", "combined"],
)
def test_draws_follow_the_truncated_distribution(params: SamplingParams) -> None:
    draws, vocab = 200_000, 12
    gen = torch.Generator().manual_seed(2026)
    logits = torch.tensor([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45])
    batch = logits.expand(draws, vocab).to(torch.bfloat16)
    tokens, logprobs = draw_rows(
        batch, *_settings(draws, params), torch.rand(draws, generator=gen), filtered=params.needs_filter
    )
    expected = expected_probs(batch[0].float(), params)
    counts = torch.bincount(tokens, minlength=vocab)
    assert set(counts.nonzero().view(-1).tolist()) == set(expected.nonzero().view(-1).tolist())
    total_variation = 0.5 * (counts.double() / draws - expected).abs().sum().item()
    assert total_variation < 0.01, f"total variation {total_variation:.4f}"
    stat, dof = chi_square(counts, expected, draws)
    assert stat < chi_square_critical(dof), f"chi-square {stat:.1f} with {dof} dof"
    want = torch.log_softmax(batch[0].float() / params.temperature, dim=-1)[tokens]
    torch.testing.assert_close(logprobs, want, rtol=0, atol=1e-6)


def test_mixed_rows_greedy_unfiltered_and_filtered_in_one_batch() -> None:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(3, 400, generator=gen) * 3
    temperatures = torch.tensor([1.0, 0.7, 1.1])
    top_ks = torch.tensor([TOP_K_ALL, TOP_K_ALL, 3])
    greedy = torch.tensor([True, False, False])
    tokens, logprobs = draw_rows(
        logits, temperatures, top_ks, torch.ones(3), torch.zeros(3), greedy, torch.tensor([0.5, 0.0, 0.0])
    )
    assert tokens[0] == logits[0].argmax()
    assert tokens[2] == logits[2].topk(3).indices.min()  # u = 0: the first kept token in index order
    assert tokens[1] == 0  # an unfiltered row: every token is kept, the first one at u = 0
    want = torch.log_softmax(logits / temperatures.view(-1, 1), -1).gather(1, tokens.view(-1, 1)).view(-1)
    torch.testing.assert_close(logprobs, want, rtol=0, atol=1e-5)


def test_the_eager_picker_draws_the_same_tokens_at_any_fan_out() -> None:
    gen = torch.Generator().manual_seed(11)
    logits = (torch.randn(16, 500, generator=gen) * 3).to(torch.bfloat16)
    table = _settings(16, SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.01))
    uniforms = torch.rand(16, generator=gen)
    tokens, logprobs = GreedyPicker().draw(logits, *table, uniforms)  # fan-out 2 eagerly
    for fan_out in (4, 8):
        want_tokens, want_logprobs = draw_rows(logits, *table, uniforms, fan_out=fan_out)
        assert torch.equal(tokens, want_tokens) and torch.equal(logprobs, want_logprobs)


def test_a_failed_compilation_is_logged_and_the_picker_draws_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    picker = GreedyPicker()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("InductorError: no kernel today")

    picker._fused, picker._draw = greedy_pick, broken  # as a compiled picker whose draw cannot compile
    with caplog.at_level("ERROR"):
        picker.warm_up_draw(64, torch.bfloat16, torch.device("cpu"))
    assert picker._draw is None and "sampled batches draw eagerly" in caplog.text
    assert "no kernel today" in caplog.text  # the traceback is logged
    logits = torch.randn(2, 64).to(torch.bfloat16)
    tokens, _ = picker.draw(logits, *_settings(2, SamplingParams(top_k=3)), torch.zeros(2))
    assert torch.equal(tokens, logits.float().topk(3).indices.min(dim=-1).values)


def test_a_kernel_picker_without_triton_on_cuda_keeps_the_torch_draw() -> None:
    """``kernel=True`` (every CUDA runner) where Triton or CUDA is missing: uniforms, the torch draw."""
    from areal_tasks.inference.server.sampling_triton import kernel_available

    picker = GreedyPicker(kernel=True)
    logits = torch.randn(3, 64)
    assert picker.kernel is kernel_available() and not picker.draws_with_seeds(logits)
    batch = SamplingBatch.build([SamplingParams(top_k=3)] * 3, [None] * 3, torch.device("cpu"))
    tokens, _ = sample(logits, batch, picker)
    assert (logits.gather(1, tokens.view(-1, 1)) >= logits.topk(3).values[:, -1:]).all()


def test_a_kernel_that_fails_to_build_leaves_the_torch_draw(monkeypatch, caplog) -> None:
    """A Triton build error at warm-up is logged with its cause and sampled batches take the torch
    draw (the server keeps serving)."""
    from areal_tasks.inference.server import sampling_triton

    def broken(*args, **kwargs):
        raise RuntimeError("PTX assembly failed")

    monkeypatch.setattr(sampling_triton, "triton_draw", broken)
    picker = GreedyPicker()
    picker.kernel = True  # as on a GPU with Triton
    with caplog.at_level("ERROR"):
        picker.warm_up_draw(64, torch.float32, torch.device("cpu"))
    assert not picker.kernel and "Triton sampling kernel failed to build" in caplog.text
    assert "PTX assembly failed" in caplog.text
    logits = torch.randn(2, 64)
    tokens, _ = sample(logits, SamplingBatch.build([SamplingParams(top_k=3)] * 2, [None] * 2, logits.device), picker)
    assert (logits.gather(1, tokens.view(-1, 1)) >= logits.topk(3).values[:, -1:]).all()
