"""Token helpers of the workflows: the trajectory builder and the template-derived feedback segment,
checked against the tiny kit's real tokenizer and chat template."""

from __future__ import annotations

import asyncio

import pytest

from areal_tasks.api.inference import ModelResponse, SamplingParams
from areal_tasks.datasets.prompts import SYSTEM_PROMPT, render_prompt
from areal_tasks.datasets.registry import Record
from areal_tasks.errors import ConfigError, TrajectoryError
from areal_tasks.rollout.workflows import MultiTurnWorkflow, TrajectoryBuilder, feedback_segment
from areal_tasks.rollout.workflows.multi_turn import DEFAULT_FEEDBACK
from areal_tasks.rollout.workflows.tokens import FeedbackSegment, chat_ids
from tests.unit.rollout.workflow_fakes import FakeEngine, FakeTokenizer, Reply, arith_reward, tiny_tokenizer

RECORD = Record("What is 12+30?", "42")


def response(ids: list[int], versions: list[int]) -> ModelResponse:
    return ModelResponse("r", [1], ids, [-0.5] * len(ids), versions, "stop", 0.0, 0.0)


def test_builder_keeps_the_lists_aligned() -> None:
    builder = TrajectoryBuilder([5, 6, 7])
    builder.add_generated(response([8, 9], [3, 4]))
    builder.add_context([10])
    builder.add_generated(response([11], [4]))
    traj = builder.build(0.5, {"k": 1})
    assert traj.input_ids == [5, 6, 7, 8, 9, 10, 11] and len(builder) == 7
    assert traj.loss_mask == [0, 0, 0, 1, 1, 0, 1]
    assert traj.logprobs == [0.0, 0.0, 0.0, -0.5, -0.5, 0.0, -0.5]
    assert traj.versions == [-1, -1, -1, 3, 4, -1, 4]
    assert traj.prompt_len == 3 and traj.reward == 0.5 and traj.metadata == {"k": 1}
    builder.add_context([12])  # the built trajectory does not alias the builder
    assert len(traj.input_ids) == 7


def test_builder_validates() -> None:
    with pytest.raises(TrajectoryError, match="prompt_len"):
        TrajectoryBuilder([]).build(1.0, {})
    with pytest.raises(TrajectoryError, match="reward"):
        TrajectoryBuilder([1]).build(float("nan"), {})


def test_segment_after_skips_the_generated_part_of_the_closer() -> None:
    segment = FeedbackSegment(closer_ids=(2, 201), turn_ids=(1, 50))
    assert segment.after([7, 8, 2]) == [201, 1, 50]
    assert segment.after([7, 8]) == [2, 201, 1, 50]
    assert segment.after([]) == [2, 201, 1, 50]
    assert segment.after([2, 201]) == [1, 50]


def test_tiny_tokenizer_feedback_segment_is_the_chatml_user_turn() -> None:
    tok = tiny_tokenizer()
    segment = feedback_segment(tok, DEFAULT_FEEDBACK, SYSTEM_PROMPT)
    assert tok.decode(list(segment.closer_ids), skip_special_tokens=False) == "<|im_end|>\n"
    assert segment.closer_ids[0] == tok.eos_token_id
    assert tok.decode(list(segment.turn_ids), skip_special_tokens=False) == (
        f"<|im_start|>user\n{DEFAULT_FEEDBACK}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tiny_tokenizer_two_turn_episode_matches_the_template_rendering() -> None:
    """With canonically tokenised answers, the episode is exactly what the template renders."""
    tok = tiny_tokenizer()
    engine = FakeEngine(tok, [Reply("Answer: 41", versions="mixed"), Reply("Answer: 42")])
    workflow = MultiTurnWorkflow(tok, SamplingParams(max_new_tokens=32), arith_reward)
    traj = asyncio.run(workflow.arun_episode(engine, RECORD))
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": RECORD.prompt},
        {"role": "assistant", "content": "Answer: 41"},
        {"role": "user", "content": DEFAULT_FEEDBACK},
    ]
    expected_request = chat_ids(tok, messages, add_generation_prompt=True)
    assert engine.requests[1].input_ids == expected_request
    assert traj.input_ids == expected_request + engine.responses[1].output_ids
    assert traj.input_ids[: traj.prompt_len] == render_prompt(tok, RECORD.prompt)
    assert traj.reward == pytest.approx(0.9) and traj.metadata["turn_rewards"] == [0.0, 1.0]


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    with pytest.raises(ConfigError, match="extends a conversation by appending"):
        feedback_segment(FakeTokenizer(drop_old_assistant_turns=True), DEFAULT_FEEDBACK, SYSTEM_PROMPT)
    with pytest.raises(ConfigError, match="appending"):
        MultiTurnWorkflow(FakeTokenizer(drop_old_assistant_turns=True), SamplingParams(), arith_reward)
