"""ArealOpenAI's Responses API: input items and function tools mapped onto chat turns, the SDK's
``Response`` back, the conversation linked across calls, and refusals naming the field."""

from __future__ import annotations

import asyncio

import pytest
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage

from areal_tasks.agent.chat_render import ChatRenderer
from areal_tasks.agent.client import ArealOpenAI
from areal_tasks.errors import AgentRequestError
from tests.unit.agent.fakes import FakeEngine, Reply, call_text
from tests.unit.agent.templates import tokenizer_named

TOOLS = [{"type": "function", "name": "add", "description": "a+b", "parameters": {"type": "object"}, "strict": False}]


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("template", ["chatml", "qwen25"])
def test_function_call_round_trip_extends_the_conversation(template: str) -> None:
    tok = tokenizer_named(template)
    engine = FakeEngine(tok, [Reply(call_text(("add", '{"a": 1, "b": 2}'))), Reply("It is 3.")])
    client = ArealOpenAI(engine, tok)

    async def agent() -> tuple[Response, Response, list]:
        items: list = [{"role": "user", "content": "1+2?"}]
        first = await client.responses.create(model="m", input=items, instructions="Use tools.", tools=TOOLS)
        items += first.output
        call = first.output[0]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "3"})
        second = await client.responses.create(model="m", input=items, instructions="Use tools.", tools=TOOLS)
        return first, second, items

    first, second, _ = run(agent())
    (call,) = first.output
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "add" and call.arguments == '{"a": 1, "b": 2}'
    assert first.status == "completed" and first.usage.input_tokens == len(engine.requests[0].input_ids)
    (message,) = second.output
    assert isinstance(message, ResponseOutputMessage) and second.output_text == "It is 3."
    a, b = list(client.cache)
    assert (a.id, b.id) == (first.id, second.id) and b.parent_id == a.id
    chat = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "1+2?"},
        a.message,
        {"role": "tool", "tool_call_id": call.call_id, "content": "3"},
    ]
    renderer = ChatRenderer(tok)
    chat_tools = [{"type": "function", "function": {k: TOOLS[0][k] for k in ("name", "description", "parameters")}}]
    assert engine.requests[1].input_ids == renderer.encode(renderer.text(chat, chat_tools))
    client.cache.set_reward(second.id, 1.0)
    (traj,) = client.cache.export("concat")
    assert traj.reward == 1.0 and traj.metadata["completion_ids"] == [first.id, second.id]


def test_previous_response_id_and_a_cut_answer() -> None:
    tok = tokenizer_named("chatml")
    engine = FakeEngine(tok, [Reply("Hello"), Reply("a long answer", eos=False)])
    client = ArealOpenAI(engine, tok)

    async def agent() -> tuple[Response, Response]:
        first = await client.responses.create(input="hi")
        second = await client.responses.create(input="more", previous_response_id=first.id, max_output_tokens=2)
        return first, second

    first, second = run(agent())
    assert first.output_text == "Hello"
    assert second.status == "incomplete" and second.incomplete_details.reason == "max_output_tokens"
    assert engine.requests[1].sampling.max_new_tokens == 2
    assert client.cache[second.id].parent_id == first.id


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", [{"type": "web_search"}]),
        ("text", {"format": {"type": "json_schema", "name": "x", "schema": {}}}),
        ("stream", True),
        ("reasoning", {"effort": "high"}),
        ("previous_response_id", "resp_unknown"),
        ("input", [{"type": "reasoning", "summary": []}]),
        ("top_logprobs", 3),
    ],
)
def test_what_does_not_map_is_refused_by_name(field: str, value) -> None:
    tok = tokenizer_named("chatml")
    client = ArealOpenAI(FakeEngine(tok, [Reply("x")]), tok)
    fields = {"input": "hi", field: value}
    with pytest.raises(AgentRequestError) as err:
        run(client.responses.create(**fields))
    assert err.value.param == field
