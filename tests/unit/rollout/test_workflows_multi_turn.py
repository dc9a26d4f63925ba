"""MultiTurnWorkflow specifics: discounted rewards, masked feedback turns, early stop, token budget."""

from __future__ import annotations

import asyncio

import pytest

from areal_tasks.api.inference import SamplingParams
from areal_tasks.datasets.prompts import render_prompt
from areal_tasks.datasets.registry import Record
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.workflows import MultiTurnWorkflow
from tests.unit.rollout.workflow_fakes import FakeEngine, FakeTokenizer, Reply, arith_reward, generated

SAMPLING = SamplingParams(max_new_tokens=16)
RECORD = Record("What is 2+3?", "5")
FEEDBACK_TEXT = "\n<|im_start|>user\nYour answer is wrong. Try again.<|im_end|>\n<|im_start|>assistant\n"


def episode(script: list[Reply], reward=arith_reward, **options):
    tok = FakeTokenizer()
    engine = FakeEngine(tok, script)
    traj = asyncio.run(MultiTurnWorkflow(tok, SAMPLING, reward, **options).arun_episode(engine, RECORD))
    return tok, engine, traj


def test_correct_at_the_first_turn_stops_with_full_reward() -> None:
    _, engine, traj = episode([Reply("Answer: 5"), Reply("never asked")])
    assert len(engine.requests) == 1 and traj.reward == 1.0
    assert traj.metadata["turns"] == 1 and traj.metadata["ended_by"] == "correct"


def test_correct_at_the_second_turn_earns_the_discount() -> None:
    _tok, engine, traj = episode([Reply("Answer: 4", versions="mixed"), Reply("Answer: 5")], turn_discount=0.8)
    assert traj.reward == pytest.approx(0.8)
    assert traj.metadata["turn_rewards"] == [0.0, 1.0] and traj.metadata["turns"] == 2
    assert traj.metadata["completions"] == ["Answer: 4", "Answer: 5"] and traj.metadata["completion"] == "Answer: 5"
    assert traj.metadata["ended_by"] == "correct"
    first, second = engine.responses
    assert traj.metadata["n_output_tokens"] == first.output_len + second.output_len
    assert traj.metadata["latency_s"] == pytest.approx(first.latency_s + second.latency_s)


def test_second_request_is_the_whole_sequence_and_feedback_is_masked() -> None:
    tok, engine, traj = episode([Reply("Answer: 4"), Reply("Answer: 5")])
    prompt = render_prompt(tok, RECORD.prompt)
    first, second = engine.responses
    feedback = tok.encode(FEEDBACK_TEXT)
    assert engine.requests[1].input_ids == prompt + first.output_ids + feedback
    assert traj.input_ids == engine.requests[1].input_ids + second.output_ids
    start = len(prompt) + first.output_len
    span = slice(start, start + len(feedback))
    assert traj.loss_mask[span] == [0] * len(feedback)
    assert traj.logprobs[span] == [0.0] * len(feedback)
    assert traj.versions[span] == [-1] * len(feedback)
    assert generated(traj.input_ids, traj.loss_mask) == first.output_ids + second.output_ids
    assert generated(traj.versions, traj.loss_mask) == first.output_versions + second.output_versions


def test_a_turn_cut_by_length_gets_the_end_of_turn_token_before_the_feedback() -> None:
    tok, engine, _traj = episode([Reply("1 + " * 10, eos=False), Reply("Answer: 5")])
    first = engine.responses[0]
    assert first.stop_reason == "length" and first.output_len == SAMPLING.max_new_tokens
    context = engine.requests[1].input_ids[len(engine.requests[0].input_ids) + first.output_len :]
    assert tok.decode(context) == "<|im_end|>" + FEEDBACK_TEXT


def test_always_wrong_uses_every_turn_and_scores_zero() -> None:
    _, engine, traj = episode([Reply("Answer: 4")], max_turns=3)
    assert len(engine.requests) == 3 and traj.reward == 0.0
    assert traj.metadata["turn_rewards"] == [0.0, 0.0, 0.0] and traj.metadata["ended_by"] == "max_turns"


def test_partial_credit_continues_and_the_last_turn_is_discounted() -> None:
    scores = iter([0.5, 0.25])

    async def partial(completion: str, answer: str) -> float:
        return next(scores)

    _, engine, traj = episode([Reply("a"), Reply("b")], reward=partial, turn_discount=0.5)
    assert len(engine.requests) == 2 and traj.reward == pytest.approx(0.25 * 0.5)
    assert traj.metadata["turn_rewards"] == [0.5, 0.25]


def test_custom_feedback_text_is_used() -> None:
    tok, engine, _ = episode([Reply("Answer: 4"), Reply("Answer: 5")], feedback="No.")
    assert tok.decode(engine.requests[1].input_ids).endswith("<|im_start|>user\nNo.<|im_end|>\n<|im_start|>assistant\n")


def test_token_budget_stops_before_a_turn_that_could_overrun_it() -> None:
    tok = FakeTokenizer()
    prompt_len = len(render_prompt(tok, RECORD.prompt))
    first_len = len(tok.encode("Answer: 4")) + 1
    second_start = prompt_len + first_len + len(tok.encode(FEEDBACK_TEXT))
    tight = second_start + SAMPLING.max_new_tokens - 1
    _, engine, traj = episode([Reply("Answer: 4"), Reply("Answer: 5")], max_total_tokens=tight)
    assert len(engine.requests) == 1 and traj.metadata["ended_by"] == "max_total_tokens"
    assert traj.reward == 0.0 and traj.metadata["turns"] == 1 and len(traj.input_ids) == prompt_len + first_len
    _, engine, traj = episode([Reply("Answer: 4"), Reply("Answer: 5")], max_total_tokens=tight + 1)
    assert len(engine.requests) == 2 and traj.reward == pytest.approx(0.9)
    assert len(traj.input_ids) <= tight + 1


def test_a_prompt_without_room_for_one_turn_is_rejected() -> None:
    tok = FakeTokenizer()
    prompt_len = len(render_prompt(tok, RECORD.prompt))
    _, engine, traj = episode([Reply("Answer: 5")], max_total_tokens=prompt_len + SAMPLING.max_new_tokens - 1)
    assert traj is None and engine.requests == []
    _, engine, traj = episode([Reply("Answer: 5")], max_prompt_len=prompt_len - 1)
    assert traj is None and engine.requests == []


def test_empty_first_answer_is_rejected_but_an_empty_later_turn_is_kept() -> None:
    _, engine, traj = episode([Reply("", eos=False)])
    assert traj is None and len(engine.requests) == 1
    _, engine, traj = episode([Reply("Answer: 4"), Reply("", eos=False)])
    assert traj is not None and traj.metadata["turns"] == 2 and traj.reward == 0.0
    assert traj.n_generated == engine.responses[0].output_len


def test_reward_raising_at_a_later_turn_propagates() -> None:
    calls = []

    async def flaky(completion: str, answer: str) -> float:
        calls.append(completion)
        if len(calls) == 2:
            raise RuntimeError("reward service down")
        return 0.0

    with pytest.raises(RuntimeError, match="reward service down"):
        episode([Reply("Answer: 4")], reward=flaky)


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_turns", 0), ("max_total_tokens", 0), ("turn_discount", 1.5), ("turn_discount", -0.1), ("feedback", "")],
)
def test_invalid_options_are_config_errors(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=option):
        MultiTurnWorkflow(FakeTokenizer(), SAMPLING, arith_reward, **{option: value})
