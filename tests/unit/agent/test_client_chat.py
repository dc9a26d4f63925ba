"""ArealOpenAI's chat completions: SDK objects back, every call recorded, multi-turn conversations
with tool calls built incrementally and equal to a fresh rendering, exported as one trajectory."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.chat import ChatCompletion

from areal_tasks.agent.chat_render import ChatRenderer
from areal_tasks.agent.client import ArealOpenAI
from areal_tasks.agent.tool_calls import parse_tool_calls
from areal_tasks.api.inference import SamplingParams
from tests.unit.agent.fakes import FakeEngine, Reply, call_text
from tests.unit.agent.templates import tokenizer_named

TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "a+b", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "mul", "description": "a*b", "parameters": {"type": "object"}}},
]
CALLS = call_text(("add", '{"a": 1, "b": 2}'), ("mul", '{"a": 3, "b": "é"}'))


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("template", ["chatml", "qwen25"])
def test_tool_conversation_is_incremental_and_equals_a_fresh_rendering(template: str) -> None:
    tok = tokenizer_named(template)
    engine = FakeEngine(tok, [Reply(CALLS), Reply("The sum is 3."), Reply("Bye.")])
    client = ArealOpenAI(engine, tok, sampling=SamplingParams(max_new_tokens=64))
    renderer = ChatRenderer(tok)

    async def agent() -> list[dict]:
        messages: list[dict] = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "1+2?"}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert isinstance(first, ChatCompletion)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert [c.function.name for c in choice.message.tool_calls] == ["add", "mul"]
        assert json.loads(choice.message.tool_calls[1].function.arguments) == {"a": 3, "b": "é"}
        messages.append(choice.message.model_dump())  # as agent code does
        for call, result in zip(choice.message.tool_calls, ["3", "x"]):
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        assert second.choices[0].message.content == "The sum is 3."
        assert second.choices[0].finish_reason == "stop"
        messages += [second.choices[0].message.model_dump(), {"role": "user", "content": "Thanks"}]
        await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        return messages

    messages = run(agent())
    # each later prompt is the parent's prompt + output + bridge, and equals a fresh rendering
    assert engine.requests[1].input_ids == renderer.encode(renderer.text(messages[:5], TOOLS))
    assert engine.requests[2].input_ids == renderer.encode(renderer.text(messages, TOOLS))
    first, second, third = list(client.cache)
    assert second.parent_id == first.id and third.parent_id == second.id
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)] == first.prompt_ids + first.output_ids
    # recorded ids decode to exactly what the agent received
    assert tok.decode(second.output_ids[:-1]) == "The sum is 3." and second.output_ids[-1] == tok.eos_token_id
    _, calls = parse_tool_calls(tok.decode(first.output_ids[:-1]))
    assert [c["function"] for c in calls] == [c["function"] for c in first.message["tool_calls"]]
    # one conversation -> one trajectory, trained exactly on the generated tokens
    client.cache.set_last_reward(1.0)
    (traj,) = client.cache.export("concat")
    assert traj.input_ids == third.prompt_ids + third.output_ids
    trained = [t for t, m in zip(traj.input_ids, traj.loss_mask) if m]
    assert trained == first.output_ids + second.output_ids + third.output_ids
    assert traj.prompt_len == len(first.prompt_ids) and traj.reward == 1.0
    assert traj.metadata["turns"] == 3 and traj.metadata["finish_reasons"] == ["tool_calls", "stop", "stop"]
    assert [len(t.input_ids) for t in client.cache.export("individual")] == [
        len(i.prompt_ids) + len(i.output_ids) for i in (first, second, third)
    ]


def test_a_conversation_that_does_not_extend_is_a_new_root() -> None:
    tok = tokenizer_named("chatml")
    engine = FakeEngine(tok, [Reply("A"), Reply("B")])
    client = ArealOpenAI(engine, tok)

    async def agent() -> None:
        first = await client.chat.completions.create(messages=[{"role": "user", "content": "x"}])
        edited = {"role": "assistant", "content": first.choices[0].message.content + " (edited)"}
        await client.chat.completions.create(
            messages=[{"role": "user", "content": "x"}, edited, {"role": "user", "content": "y"}]
        )

    run(agent())
    assert [i.parent_id for i in client.cache] == [None, None]
    assert len(client.cache.export("concat")) == 2


def test_output_cut_by_length_is_closed_by_the_bridge_untrained() -> None:
    tok = tokenizer_named("chatml")
    engine = FakeEngine(tok, [Reply("one two three four", eos=False), Reply("ok")])
    client = ArealOpenAI(engine, tok)

    async def agent() -> None:
        messages = [{"role": "user", "content": "count"}]
        first = await client.chat.completions.create(messages=messages, max_tokens=3)
        assert first.choices[0].finish_reason == "length"
        messages += [first.choices[0].message.model_dump(), {"role": "user", "content": "go on"}]
        await client.chat.completions.create(messages=messages)

    run(agent())
    first, second = list(client.cache)
    assert engine.requests[0].sampling.max_new_tokens == 3 and second.parent_id == first.id
    bridge = second.prompt_ids[len(first.prompt_ids) + len(first.output_ids) :]
    assert tok.decode(bridge).startswith("<|im_end|>\n<|im_start|>user\ngo on")
    (traj,) = client.cache.export("concat")
    assert [t for t, m in zip(traj.input_ids, traj.loss_mask) if m] == first.output_ids + second.output_ids


def test_tool_choice_none_renders_no_tools_and_parses_nothing() -> None:
    tok = tokenizer_named("chatml")
    engine = FakeEngine(tok, [Reply(call_text(("add", "{}")))])
    client = ArealOpenAI(engine, tok)
    out = run(
        client.chat.completions.create(messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="none")
    )
    assert "# Tools" not in tok.decode(engine.requests[0].input_ids)
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason == "stop"
    named = {"type": "function", "function": {"name": "add"}}
    out = run(
        client.chat.completions.create(messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice=named)
    )
    assert out.choices[0].message.tool_calls[0].function.name == "add"


def test_parallel_tool_calls_false_returns_the_first_call_and_still_extends() -> None:
    tok = tokenizer_named("chatml")
    engine = FakeEngine(tok, [Reply(CALLS), Reply("done")])
    client = ArealOpenAI(engine, tok)

    async def agent() -> None:
        messages = [{"role": "user", "content": "x"}]
        out = await client.chat.completions.create(messages=messages, tools=TOOLS, parallel_tool_calls=False)
        assert len(out.choices[0].message.tool_calls) == 1
        call = out.choices[0].message.tool_calls[0]
        messages += [out.choices[0].message.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": "3"}]
        await client.chat.completions.create(messages=messages, tools=TOOLS, parallel_tool_calls=False)

    run(agent())
    first, second = list(client.cache)
    assert second.parent_id == first.id
