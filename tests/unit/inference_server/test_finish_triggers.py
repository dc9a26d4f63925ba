"""The decode step's finish fast path: ``FinishChecker.prepare`` precomputes when a rule can apply
(stop and EOS tokens, the length budget, stop strings), and the engine calls the full check only
then. Over random token streams and settings, the step and reason at which a sequence finishes
must be exactly those of the full check after every token; an unprepared sequence always gets the
full check."""

from __future__ import annotations

import random

import pytest

from areal_tasks.inference.server.request import FinishChecker, Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams

EOS = frozenset({2, 3})


class _Tokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - ord("a") for c in text]


def _finish_step(checker: FinishChecker, seq: Sequence, tokens: list[int], fast: bool) -> tuple[int, dict | None]:
    for step, token in enumerate(tokens):
        seq.output_ids.append(token)
        if not fast or seq.watch_text or token in seq.stop_ids or len(seq.output_ids) >= seq.length_cap:
            reason = checker.check(seq)
            if reason is not None:
                return step, reason
    return len(tokens), None


def _sequence(prompt_len: int, params: SamplingParams) -> Sequence:
    return Sequence(rid="r", group=SequenceGroup(prompt_ids=[7] * prompt_len), params=params, on_finish=lambda s: None)


@pytest.mark.parametrize("seed", range(40))
def test_fast_path_finishes_exactly_where_the_full_check_does(seed: int) -> None:
    rng = random.Random(seed)
    checker = FinishChecker(_Tokenizer(), EOS, context_length=rng.choice([20, 64, 512]))
    params = SamplingParams(
        max_new_tokens=rng.choice([1, 5, 30, 100]),
        ignore_eos=rng.random() < 0.4,
        stop_token_ids=frozenset(rng.sample(range(30), rng.choice([0, 1, 3]))),
        stop=tuple(rng.choice([(), ("xyz",), ("bc", "q")])),
    )
    prompt_len = rng.randint(1, 15)
    tokens = [rng.randrange(30) for _ in range(120)]
    full = _finish_step(checker, _sequence(prompt_len, params), tokens, fast=False)
    prepared = _sequence(prompt_len, params)
    checker.prepare(prepared)
    assert _finish_step(checker, prepared, tokens, fast=True) == full
    # an unprepared sequence goes through the full check every time
    assert _finish_step(checker, _sequence(prompt_len, params), tokens, fast=True) == full
