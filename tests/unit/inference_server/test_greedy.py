"""The greedy picker: argmax ids and their logprobs equal to a log_softmax reference, eager and
compiled (half-precision logits, read without an fp32 copy), and the sampler hands all-greedy
batches to the picker it is given."""

from __future__ import annotations

import torch

from areal_tasks.inference.server.greedy import GreedyPicker, greedy_pick
from areal_tasks.inference.server.sampling import SamplingBatch, SamplingParams, sample


def _reference(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    tokens = logits.float().argmax(dim=-1)
    return tokens, logprobs.gather(1, tokens.view(-1, 1)).view(-1)


def test_eager_pick_matches_log_softmax() -> None:
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(0)) * 4
    tokens, logprobs = greedy_pick(logits)
    want_tokens, want_logprobs = _reference(logits)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=0, atol=1e-5)


def test_compiled_pick_on_half_precision_matches_and_fp32_stays_eager() -> None:
    picker = GreedyPicker(compiled=True)
    picker.warm_up(vocab=300, dtype=torch.bfloat16, device=torch.device("cpu"))
    for rows in (1, 3, 7):  # batch 1 and two other sizes: compiled once for each of 1 and "many"
        logits = (torch.randn(rows, 300, generator=torch.Generator().manual_seed(rows)) * 4).to(torch.bfloat16)
        tokens, logprobs = picker(logits)
        want_tokens, want_logprobs = _reference(logits)
        assert torch.equal(tokens, want_tokens) and logprobs.dtype == torch.float32
        torch.testing.assert_close(logprobs, want_logprobs, rtol=0, atol=1e-5)
    assert GreedyPicker(compiled=False)._fused is None


def test_sample_hands_all_greedy_batches_to_the_given_picker() -> None:
    seen = []

    def picker(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(logits.shape)
        return greedy_pick(logits)

    logits = torch.randn(2, 50)
    greedy = SamplingBatch.build([SamplingParams(temperature=0.0)] * 2, [None, None], logits.device)
    tokens, _ = sample(logits, greedy, picker)
    assert seen == [(2, 50)] and torch.equal(tokens, logits.argmax(-1))
    mixed = SamplingBatch.build(
        [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)], [None, None], logits.device
    )
    sample(logits, mixed, picker)
    assert len(seen) == 1  # a mixed batch samples every row itself


def test_warm_up_leaves_nothing_to_compile_for_the_engine_threads_inference_mode(monkeypatch) -> None:
    """The engine thread picks and draws under inference mode; a warm-up compiled outside it would
    leave its first steps to compile again (on a GPU that waits for the device mid-serve)."""
    from functools import partial

    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend="eager"))  # guards only: fast
    torch._dynamo.reset()
    picker = GreedyPicker(compiled=True)
    picker.warm_up(vocab=300, dtype=torch.bfloat16, device=torch.device("cpu"))
    picker.warm_up_draw(vocab=300, dtype=torch.bfloat16, device=torch.device("cpu"))
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0
    with torch.inference_mode():
        for rows in (1, 5):
            logits = (torch.randn(rows, 300) * 4).to(torch.bfloat16)
            picker(logits)
            ones = torch.ones(rows)
            no = torch.zeros(rows, dtype=torch.bool)
            top_ks = torch.full((rows,), 300, dtype=torch.long)
            for filtered in (False, True):
                picker.draw(logits, ones, top_ks, ones * 0.9, ones * 0, no, torch.rand(rows), filtered=filtered)
    assert counters["stats"]["unique_graphs"] == compiled
    torch._dynamo.reset()
