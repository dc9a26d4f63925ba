"""Top-k alternatives of sampled tokens (``top_logprobs.py``), in the sampler and through the engine.

* on a mixed batch (greedy, temperature, filtered, seeded; k = 0, 1, 5 rows), the rows that ask get
  ``topk`` of ``log_softmax(logits / T)`` (raw logits for greedy rows), their own ``k`` each; the
  sampled token's logprob equals its entry there; the k = 0 rows' tokens and logprobs are exactly
  what the sampler gave without alternatives, and a batch where no row asks computes nothing;
* through the engine (prefill and overlapped decode steps), the alternatives at every generated
  position, and at the prompt positions, agree with a teacher-forced transformers forward within
  1e-4 (the logprob parity tolerance of ``test_engine_correctness.py``), greedy and sampled;
* a request without alternatives batched with ones that ask gives the same tokens and logprobs as
  alone, and carries no alternatives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from server_helpers import generate, make_request
from transformers import AutoModelForCausalLM

from areal_tasks.inference.server.sampling import SamplingBatch, SamplingParams, make_generator, sample
from areal_tasks.inference.server.top_logprobs import entries, top_logprobs

#: the logprob parity tolerance against a transformers forward (test_engine_correctness.py).
ATOL = 1e-4
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [100, 200, 300, 400, 500, 600, 700, 800, 900]]


@pytest.fixture(scope="module")
def reference(tiny_qwen2: Path, one_thread: None):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()


def _mixed() -> tuple[list[SamplingParams], list[int]]:
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_p=0.8, top_k=40, min_p=0.01),
        SamplingParams(temperature=1.0, sampling_seed=3),
        SamplingParams(temperature=0.5),
    ]
    return params, [3, 0, 5, 1, 0]


def test_sampler_alternatives_are_the_sampled_distributions_topk() -> None:
    params, counts = _mixed()
    logits = 3 * torch.randn(len(params), 400, generator=torch.Generator().manual_seed(0))
    gens = [make_generator(p.sampling_seed, logits.device) for p in params]
    plain_gens = [make_generator(p.sampling_seed, logits.device) for p in params]
    plain_batch = SamplingBatch.build(params, plain_gens, logits.device)
    torch.manual_seed(5)  # the unseeded rows draw from the shared stream: the same draws both times
    plain_tokens, plain_logprobs = sample(logits, plain_batch)
    batch = SamplingBatch.build(params, gens, logits.device, counts)
    torch.manual_seed(5)
    tokens, logprobs = sample(logits, batch)
    logprobs, table = top_logprobs(logits, batch, tokens, logprobs)
    assert torch.equal(tokens, plain_tokens), "asking for alternatives changed what was sampled"
    assert batch.top is not None and batch.top.rows == [0, 2, 3] and table is not None
    assert table.shape == (2, 3, 5)  # one topk over the batch's largest k
    got = entries(batch.top, table.tolist())
    for row, entry in zip(batch.top.rows, got):
        temperature = 1.0 if params[row].greedy else params[row].temperature
        want = torch.log_softmax(logits[row] / temperature, -1)
        values, ids = want.topk(counts[row])
        assert [t for t, _ in entry] == ids.tolist()
        assert [v for _, v in entry] == pytest.approx(values.tolist(), abs=1e-6)
        token = int(tokens[row])
        assert logprobs[row].item() == pytest.approx(want[token].item(), abs=1e-6)
        own = dict(entry).get(token)
        if own is not None:  # the sampled token's logprob is its entry among the alternatives, exactly
            assert logprobs[row].item() == own
    assert entries(batch.top, table.tolist())[0][0][0] == int(logits[0].argmax())  # greedy: the argmax first
    for row in (1, 4):  # rows that did not ask: untouched
        assert logprobs[row].item() == plain_logprobs[row].item()
    empty = SamplingBatch.build(params, [None] * len(params), logits.device, [0] * len(params))
    same, none = top_logprobs(logits, empty, tokens, plain_logprobs)
    assert empty.top is None and none is None and same is plain_logprobs


def test_all_greedy_batches_keep_the_picker_and_get_alternatives_of_the_raw_logits() -> None:
    seen = []

    def picker(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(logits.shape)
        return logits.argmax(-1), torch.log_softmax(logits, -1).max(-1).values

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    batch = SamplingBatch.build([SamplingParams(temperature=0.0)] * 3, [None] * 3, logits.device, [0, 2, 0])
    tokens, logprobs = sample(logits, batch, picker)
    logprobs, table = top_logprobs(logits, batch, tokens, logprobs)
    assert seen == [(3, 50)] and table is not None
    (entry,) = entries(batch.top, table.tolist())
    ids = torch.log_softmax(logits[1], -1).topk(2).indices
    assert [t for t, _ in entry] == ids.tolist() and entry[0] == (int(tokens[1]), logprobs[1].item())


def _forward_logprobs(model, prompt: list[int], output: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at every generated position, teacher-forced ([len(output), V])."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].double()
    return torch.log_softmax(logits / temperature, -1)


def check_alternatives(want: torch.Tensor, tops: list[list[tuple[int, float]]], k: int) -> None:
    """Each position's alternatives are the reference's top k: their values match the reference's
    at those ids and the reference's k largest values (robust to near-ties swapping order)."""
    assert len(tops) == want.shape[0]
    for position, entry in zip(want, tops):
        assert len(entry) == k
        values = [v for _, v in entry]
        assert values == sorted(values, reverse=True)
        at_ids = position[[t for t, _ in entry]]
        assert values == pytest.approx(at_ids.tolist(), abs=ATOL)
        assert values == pytest.approx(position.topk(k).values.tolist(), abs=ATOL)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_engine_alternatives_match_a_forward_pass(engine, reference, temperature: float) -> None:
    """Greedy and sampled requests with different k, decoded together with one that asks for none."""
    counts = [3, 1, 0]
    reqs = [
        make_request(
            p, rid=f"top{temperature}-{i}", temperature=temperature, max_new_tokens=10, ignore_eos=True, sampling_seed=i
        )
        for i, p in enumerate(PROMPTS)
    ]
    for req, k in zip(reqs, counts):
        req.seqs[0].top_logprobs_num = k
        engine.submit(req.seqs)
    done = [req.wait()[0] for req in reqs]
    for seq, prompt, k in zip(done, PROMPTS, counts):
        want = _forward_logprobs(reference, prompt, seq.output_ids, temperature or 1.0)
        own = want.gather(1, torch.tensor(seq.output_ids).view(-1, 1)).view(-1)
        assert torch.allclose(torch.tensor(seq.output_logprobs, dtype=torch.float64), own, atol=ATOL, rtol=0)
        if k == 0:
            assert seq.output_top_logprobs == []
            continue
        check_alternatives(want, seq.output_top_logprobs, k)
        for token, logprob, entry in zip(seq.output_ids, seq.output_logprobs, seq.output_top_logprobs):
            if token in dict(entry):
                assert dict(entry)[token] == logprob
        if temperature == 0.0:  # greedy: the token is the most likely one
            assert [entry[0][0] for entry in seq.output_top_logprobs] == seq.output_ids
    alone = generate(
        engine, PROMPTS[2], rid="alone", temperature=temperature, max_new_tokens=10, ignore_eos=True, sampling_seed=2
    )
    assert alone.output_ids == done[2].output_ids
    assert torch.allclose(torch.tensor(alone.output_logprobs), torch.tensor(done[2].output_logprobs), atol=1e-5)


def test_prompt_alternatives_match_a_forward_pass(engine, reference) -> None:
    prompt = PROMPTS[2]
    req = make_request(prompt, rid="prompt-top", temperature=0.0, max_new_tokens=2)
    req.seqs[0].logprob_start_len, req.seqs[0].top_logprobs_num = 2, 4
    engine.submit(req.seqs)
    seq = req.wait()[0]
    tops = seq.group.input_top_logprobs
    # positions 2.. of the prompt (SGLang's logprob_start_len), each predicted from the tokens before it
    assert len(tops) == len(seq.group.input_logprobs) == len(prompt) - 2 and None not in tops
    check_alternatives(_forward_logprobs(reference, prompt[:2], prompt[2:], 1.0), tops, 4)
    assert len(seq.output_top_logprobs) == 2
