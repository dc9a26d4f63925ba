"""Engine correctness against transformers: greedy tokens, logprobs, and batching invariance.

* greedy output is token-identical to ``transformers.generate`` (fp32, CPU) for prompts of
  different lengths decoded together, with requests finishing early and one joining mid-run;
* returned logprobs (greedy: log_softmax(logits); sampled: log_softmax(logits / T)) agree with a
  teacher-forced transformers forward over prompt + output within 1e-4, and so do prompt logprobs;
* every request gives the same tokens in a continuous batch as alone (greedy and seeded sampling);
* tokens sampled after a fixed prefix follow the model's temperature/top-p distribution.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from server_helpers import chi_square, chi_square_critical, expected_probs, generate, make_request
from transformers import AutoModelForCausalLM

from areal_tasks.inference.server.sampling import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [100, 200, 300, 400, 500, 600, 700, 800, 900], [42] * 20, [3, 1, 4]]
LENGTHS = [24, 9, 17, 30, 4]


@pytest.fixture(scope="module")
def reference(tiny_qwen2: Path, one_thread: None):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()


def _hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def _hf_logprobs(model, prompt: list[int], output: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log p(output[i] | prompt + output[:i]) from one forward pass."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
    return torch.log_softmax(logits / temperature, -1).gather(1, torch.tensor(output).view(-1, 1)).view(-1)


def test_greedy_matches_generate_under_continuous_batching(engine, reference) -> None:
    expected = [_hf_greedy(reference, p, n) for p, n in zip(PROMPTS, LENGTHS)]
    long = make_request([7, 7, 7, 7], rid="long", temperature=0.0, max_new_tokens=200, ignore_eos=True)
    engine.submit(long.seqs)
    while len(long.seqs[0].output_ids) < 3:
        time.sleep(0.001)
    reqs = [
        make_request(p, rid=f"r{i}", temperature=0.0, max_new_tokens=n, ignore_eos=True)
        for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))
    ]
    for req in reqs:
        engine.submit(req.seqs)
    results = [req.wait()[0] for req in reqs]
    long_seq = long.wait()[0]
    for seq, want in zip(results, expected):
        assert seq.output_ids == want, seq.rid
        assert seq.finish_reason == {"type": "length", "length": len(want)}
    # the short requests joined while the long one was running, and left before it ended
    assert all(seq.first_token_at < long_seq.finished_at for seq in results)
    assert all(seq.finished_at < long_seq.finished_at for seq in results)
    assert long_seq.output_ids == _hf_greedy(reference, [7, 7, 7, 7], 200)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_output_logprobs_match_a_forward_pass(engine, reference, temperature: float) -> None:
    reqs = [
        make_request(p, rid=f"lp{i}", temperature=temperature, max_new_tokens=12, ignore_eos=True, sampling_seed=i)
        for i, p in enumerate(PROMPTS[:3])
    ]
    for req in reqs:
        engine.submit(req.seqs)
    for req, prompt in zip(reqs, PROMPTS):
        seq = req.wait()[0]
        want = _hf_logprobs(reference, prompt, seq.output_ids, temperature or 1.0)
        got = torch.tensor(seq.output_logprobs, dtype=torch.float64)
        assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()


def test_prompt_logprobs_match_a_forward_pass(engine, reference) -> None:
    prompt = PROMPTS[2]
    req = make_request(prompt, rid="plp", temperature=0.0, max_new_tokens=2)
    req.seqs[0].logprob_start_len = 0
    engine.submit(req.seqs)
    seq = req.wait()[0]
    values = seq.group.input_logprobs
    assert len(values) == len(prompt) and values[0] is None
    want = _hf_logprobs(reference, prompt[:1], prompt[1:])
    assert torch.allclose(torch.tensor(values[1:], dtype=torch.float64), want, atol=1e-4, rtol=0)


def test_batched_results_equal_running_alone(engine) -> None:
    settings = [
        {"temperature": 0.0, "max_new_tokens": 15},
        {"temperature": 0.9, "top_p": 0.9, "sampling_seed": 3, "max_new_tokens": 20},
        {"temperature": 1.2, "top_k": 30, "sampling_seed": 4, "max_new_tokens": 7},
        {"temperature": 0.8, "min_p": 0.001, "sampling_seed": 5, "max_new_tokens": 25},
    ]
    alone = [generate(engine, PROMPTS[i], rid=f"alone{i}", ignore_eos=True, **kw) for i, kw in enumerate(settings)]
    reqs = [make_request(PROMPTS[i], rid=f"batch{i}", ignore_eos=True, **kw) for i, kw in enumerate(settings)]
    for req in reqs:
        engine.submit(req.seqs)
    together = [req.wait()[0] for req in reqs]
    for a, b in zip(alone, together):
        assert a.output_ids == b.output_ids
        assert torch.allclose(torch.tensor(a.output_logprobs), torch.tensor(b.output_logprobs), atol=1e-5)
    assert len({tuple(s.output_ids) for s in alone}) == len(alone)


def test_n_samples_share_the_prompt_and_equal_single_runs(engine) -> None:
    req = make_request(
        PROMPTS[0], rid="multi", n=4, temperature=1.0, sampling_seed=100, max_new_tokens=10, ignore_eos=True
    )
    engine.submit(req.seqs)
    samples = req.wait()
    assert [s.rid for s in samples] == ["multi_0", "multi_1", "multi_2", "multi_3"]
    assert len({tuple(s.output_ids) for s in samples}) == 4
    for j, seq in enumerate(samples):
        single = generate(
            engine,
            PROMPTS[0],
            rid=f"single{j}",
            temperature=1.0,
            sampling_seed=100 + j,
            max_new_tokens=10,
            ignore_eos=True,
        )
        assert single.output_ids == seq.output_ids


def test_sampled_first_tokens_follow_the_models_distribution(engine, reference) -> None:
    """3000 samples of the token after a fixed prefix (one request, n = 3000, temperature 0.05, top-p
    0.8) against SGLang's distribution over transformers' logits, by chi-square at p = 1e-6."""
    prefix, draws = [5, 6, 7, 8, 9], 3000
    params = {"temperature": 0.05, "top_p": 0.8, "max_new_tokens": 1, "sampling_seed": 2024}
    req = make_request(prefix, rid="stat", n=draws, return_logprob=False, **params)
    engine.submit(req.seqs)
    tokens = torch.tensor([s.output_ids[0] for s in req.wait()])
    with torch.no_grad():
        logits = reference(torch.tensor([prefix])).logits[0, -1]
    expected = expected_probs(logits, SamplingParams(**params))
    counts = torch.bincount(tokens, minlength=len(expected))
    support = set(torch.nonzero(expected).view(-1).tolist())
    assert set(tokens.tolist()) <= support and 5 < len(support) < 100
    stat, dof = chi_square(counts, expected, draws)
    assert stat < chi_square_critical(dof), f"chi-square {stat:.1f} with {dof} dof"
