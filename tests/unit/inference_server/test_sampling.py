"""Sampling parameters (SGLang's names, defaults and checks) and the batched sampler.

The statistical tests draw many samples in one batched call from fixed logits and compare the
counts with the distribution SGLang's sampler defines (softmax of logits / temperature, then
top-k, top-p on the unfiltered cumulative mass, min-p, renormalised) by a chi-square test at
significance 1e-6, plus an exact check that filtered-out tokens are never drawn.
"""

from __future__ import annotations

import pytest
import torch
from server_helpers import chi_square, chi_square_critical, expected_probs

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.sampling import SamplingBatch, SamplingParams, make_generator, sample


def test_defaults_match_sglang() -> None:
    p = SamplingParams.from_dict({})
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.n) == (128, 1.0, 1.0, -1, 0.0, 1)
    assert not p.greedy and not p.needs_filter
    assert SamplingParams.from_dict({"temperature": 0}).greedy
    assert SamplingParams.from_dict({"top_k": 1}).greedy
    # SGLang's schema default for "whole vocabulary" and nulls meaning "default"
    assert SamplingParams.from_dict({"top_k": 1 << 30, "temperature": None, "stop": None}).top_k == -1


def test_stop_forms_and_ids() -> None:
    p = SamplingParams.from_dict({"stop": "END", "stop_token_ids": [3, 4, None]})
    assert p.stop == ("END",) and p.stop_token_ids == frozenset({3, 4})
    assert SamplingParams.from_dict({"stop": ["a", "b"]}).stop == ("a", "b")


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"n": 0}, "n must be"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"sampling_seed": 2**64}, "sampling_seed"),
        ({"stop": [""]}, "stop"),
        ({"no_such_field": 1}, "unknown fields ['no_such_field']"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"regex": "a+"}, "regex"),
        ({"logit_bias": {"1": 2.0}}, "logit_bias"),
    ],
)
def test_invalid_or_unsupported_params_are_refused(raw: dict, fragment: str) -> None:
    with pytest.raises(InferenceRequestError, match="sampling_params") as info:
        SamplingParams.from_dict(raw)
    assert fragment in str(info.value)


def test_unsupported_params_at_default_are_accepted() -> None:
    p = SamplingParams.from_dict({"frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {}})
    assert p == SamplingParams()


def _batch(params: list[SamplingParams], gens: list | None = None) -> SamplingBatch:
    return SamplingBatch.build(params, gens or [None] * len(params), torch.device("cpu"))


def test_greedy_rows_take_argmax_with_raw_logprobs() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.7),
        SamplingParams(top_k=1),
        SamplingParams(temperature=0.0),
    ]
    tokens, logprobs = sample(logits, _batch(params))
    for row in (0, 2, 3):
        assert tokens[row] == logits[row].argmax()
        assert logprobs[row] == pytest.approx(torch.log_softmax(logits[row], -1)[tokens[row]].item(), abs=1e-6)
    # a sampled row reports log_softmax(logits / T) of its token
    expected = torch.log_softmax(logits[1] / 0.7, -1)[tokens[1]].item()
    assert logprobs[1] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=0.9, top_k=7),
        SamplingParams(temperature=1.0, top_p=0.9, top_k=20, min_p=0.05),
    ],
    ids=["temperature", "top_p", "top_k", "all_filters"],
)
def test_sampling_matches_the_target_distribution(params: SamplingParams) -> None:
    torch.manual_seed(1234)
    vocab, draws = 40, 20000
    logits = torch.randn(vocab) * 1.5
    tokens, _ = sample(logits.expand(draws, vocab).clone(), _batch([params] * draws))
    counts = torch.bincount(tokens, minlength=vocab)
    expected = expected_probs(logits, params)
    assert set(torch.nonzero(counts).view(-1).tolist()) <= set(torch.nonzero(expected).view(-1).tolist())
    stat, dof = chi_square(counts, expected, draws)
    assert stat < chi_square_critical(dof), f"chi-square {stat:.1f} with {dof} dof"


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 30)
    p = SamplingParams(temperature=1.0, top_p=0.95, sampling_seed=7)
    alone = sample(logits[1:2], _batch([p], [make_generator(7, torch.device("cpu"))]))[0].item()
    gens = [None, make_generator(7, torch.device("cpu")), None]
    batched = sample(logits, _batch([SamplingParams(), p, SamplingParams()], gens))[0][1].item()
    assert alone == batched
    # the same seed replays the same stream of draws
    g1, g2 = make_generator(11, torch.device("cpu")), make_generator(11, torch.device("cpu"))
    draws1 = [sample(logits[:1], _batch([p], [g1]))[0].item() for _ in range(20)]
    draws2 = [sample(logits[:1], _batch([p], [g2]))[0].item() for _ in range(20)]
    assert draws1 == draws2 and len(set(draws1)) > 1
