"""The calculator demo task: its spec, records with the tool schema, tool-using SFT transcripts and
their loss mask over every assistant turn."""

from __future__ import annotations

import collections

import pytest

from areal_tasks.agent.tools.calculator import CALCULATOR_TOOL
from areal_tasks.datasets import (
    SYSTEM_PROMPT,
    CalculatorOptions,
    arithmetic_reward,
    build_demonstrations,
    calculator,
    default_system_prompt,
    load_records,
    render_messages,
    render_transcript,
)
from areal_tasks.datasets.registry import arithmetic_options
from areal_tasks.errors import ConfigError


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from areal_tasks.models import load_tokenizer

    return load_tokenizer("tiny:qwen2")


SPEC = "demo:calculator?digits=2&n_train=200&n_eval=20&wrong_fraction=0.3&seed=3"


def test_spec_records_and_defaults() -> None:
    opts = arithmetic_options(SPEC)
    assert isinstance(opts, CalculatorOptions) and (opts.digits, opts.ops, opts.n_train) == (2, "+-", 200)
    assert arithmetic_options("demo:calculator").digits == 2
    train, evaluation = load_records(SPEC, "train"), load_records(SPEC, "eval")
    assert len(train) == 200 and len(evaluation) == 20
    assert not {r.prompt for r in train} & {r.prompt for r in evaluation}
    for record in train:
        assert record.tools == (CALCULATOR_TOOL,)
        left, op, right = calculator.expression_of(record.prompt).split()
        assert int(record.answer) == (int(left) + int(right) if op == "+" else int(left) - int(right))
    assert load_records("demo:arithmetic?n_train=3&n_eval=1")[0].tools == ()
    assert default_system_prompt(SPEC) == calculator.SYSTEM_PROMPT
    assert default_system_prompt("demo:arithmetic") == SYSTEM_PROMPT
    with pytest.raises(ConfigError, match="only \\+ and -"):
        arithmetic_options("demo:calculator?ops=>")
    with pytest.raises(ConfigError, match="not of the form"):
        calculator.expression_of("Which is larger, 1 or 2?")


def test_demonstrations_call_the_tool_and_are_wrong_at_the_fraction() -> None:
    records = load_records(SPEC, "train")
    demos = build_demonstrations(records, 0.3, seed=5)
    assert demos == build_demonstrations(records, 0.3, seed=5)
    kinds = collections.Counter((d.correct, bool(d.turns)) for d in demos)
    assert kinds[(True, False)] == 0 and kinds[(False, True)] + kinds[(False, False)] == 60
    assert kinds[(False, True)] > 10 and kinds[(False, False)] > 10  # both ways of being wrong
    for record, demo in zip(records, demos):
        assert (arithmetic_reward(demo.response, record.answer) == 1.0) == demo.correct
        assert demo.tools == record.tools
        if demo.turns:
            call, result = demo.turns
            assert call["tool_calls"][0]["function"]["name"] == "calculator"
            assert result == {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": record.answer}


def test_loss_mask_covers_every_assistant_turn_and_nothing_else(tiny_tokenizer) -> None:
    record = load_records(SPEC, "train")[0]
    demo = next(d for d in build_demonstrations([record] * 4, 0.0) if d.turns)
    ids, mask = render_messages(tiny_tokenizer, demo.messages(calculator.SYSTEM_PROMPT), demo.tools)
    trained = tiny_tokenizer.decode([t for t, m in zip(ids, mask) if m])
    expression = calculator.expression_of(record.prompt)
    assert trained == (
        f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call><|im_end|>'
        f"Answer: {record.answer}<|im_end|>"
    )
    text = tiny_tokenizer.decode(ids)
    assert '"name": "calculator"' in text.split("<|im_start|>user")[0]  # the schema in the system turn
    assert f"<|im_start|>tool\n{record.answer}<|im_end|>" in text


def test_single_turn_transcripts_are_unchanged(tiny_tokenizer) -> None:
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What is 1 + 2?"},
        {"role": "assistant", "content": "Answer: 3"},
    ]
    assert render_transcript(tiny_tokenizer, "What is 1 + 2?", "Answer: 3") == render_messages(tiny_tokenizer, messages)
    demo = build_demonstrations(load_records("demo:arithmetic?n_train=3&n_eval=1"), 0.0)[0]
    assert demo.turns == () and demo.messages(SYSTEM_PROMPT)[-1] == {"role": "assistant", "content": demo.response}
