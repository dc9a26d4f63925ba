"""ArealOpenAI's request fields: sampling mapped, n, stop strings, logprobs in OpenAI's shape,
streaming chunks equal to the whole answer, fields ignored or refused by name; legacy completions."""

from __future__ import annotations

import asyncio

import pytest
from openai import NOT_GIVEN
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from areal_tasks.agent.client import ArealOpenAI
from areal_tasks.api.inference import SamplingParams
from areal_tasks.errors import AgentError, AgentRequestError
from tests.unit.agent.fakes import FakeEngine, Reply, call_text
from tests.unit.agent.templates import tokenizer_named

USER = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def run(coro):
    return asyncio.run(coro)


def _client(*replies: Reply, **kwargs) -> tuple[ArealOpenAI, FakeEngine]:
    tok = tokenizer_named("chatml")
    engine = FakeEngine(tok, list(replies) or [Reply("Hello there, é!")])
    return ArealOpenAI(engine, tok, **kwargs), engine


def test_sampling_defaults_and_overrides() -> None:
    defaults = SamplingParams(max_new_tokens=40, temperature=0.7, top_p=0.9, stop_token_ids=(5,))
    client, engine = _client(sampling=defaults)
    run(client.chat.completions.create(messages=USER, temperature=NOT_GIVEN, top_p=None, user="u", metadata={"a": 1}))
    assert engine.requests[0].sampling == defaults
    overrides = {"temperature": 0.0, "top_p": 0.5, "max_completion_tokens": 7, "stop": "x", "seed": 3, "n": 2}
    ignored = {"store": True, "service_tier": "auto", "prompt_cache_key": "k"}
    run(client.chat.completions.create(messages=USER, extra_body={"top_k": 4}, **overrides, **ignored))
    a, b = engine.requests[1:3]
    assert (a.sampling.temperature, a.sampling.top_p, a.sampling.max_new_tokens, a.sampling.top_k) == (0.0, 0.5, 7, 4)
    assert a.sampling.stop == ("x",) and a.sampling.stop_token_ids == (5,)
    assert (a.sampling.seed, b.sampling.seed) == (3, 4)


def test_n_choices_are_separate_interactions() -> None:
    client, engine = _client(Reply("one"), Reply("two"))
    out = run(client.chat.completions.create(messages=USER, n=2))
    assert [c.index for c in out.choices] == [0, 1] and [c.message.content for c in out.choices] == ["one", "two"]
    assert [i.id for i in client.cache] == [out.id, f"{out.id}-1"]
    assert out.usage.prompt_tokens == len(engine.requests[0].input_ids)
    assert out.usage.completion_tokens == sum(len(r.output_ids) for r in engine.responses)
    client.cache.set_reward(out.id, 1.0)
    assert [i.reward for i in client.cache] == [1.0, 1.0]


def test_stop_string_cuts_the_content_but_not_the_recorded_tokens() -> None:
    client, engine = _client(Reply("answer: 4. more"))
    out = run(client.chat.completions.create(messages=USER, stop=["."]))
    assert out.choices[0].message.content == "answer: 4"
    assert client.cache[out.id].output_ids == engine.responses[0].output_ids


def test_logprobs_in_openai_shape() -> None:
    client, engine = _client()
    out = run(client.chat.completions.create(messages=USER, logprobs=True, top_logprobs=0))
    content = out.choices[0].logprobs.content
    tok = client.tokenizer
    ids = engine.responses[0].output_ids[:-1]  # the EOS is not part of the content
    assert [c.logprob for c in content] == engine.responses[0].output_logprobs[: len(ids)]
    assert b"".join(bytes(c.bytes) for c in content).decode() == out.choices[0].message.content
    assert all(c.top_logprobs == [] for c in content) and [c.token for c in content] == [tok.decode([t]) for t in ids]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_logprobs", 2),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}),
        ("logit_bias", {"5": 10}),
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("presence_penalty", 0.5),
        ("n", 0),
        ("temperature", -1.0),
        ("max_tokens", 0),
        ("tool_choice", "required"),
        ("stream_options", {"include_usage": True}),
    ],
)
def test_fields_that_cannot_be_honoured_are_refused_by_name(field: str, value) -> None:
    client, engine = _client()
    with pytest.raises(AgentRequestError) as err:
        run(client.chat.completions.create(messages=USER, **{field: value}))
    assert err.value.param == field and not engine.requests and len(client.cache) == 0


def test_bad_client_settings_and_aborts_raise_agent_error() -> None:
    tok = tokenizer_named("chatml")
    with pytest.raises(AgentError, match="tool_call_parser"):
        ArealOpenAI(FakeEngine(tok, []), tok, tool_call_parser="mistral")


async def _collect(stream) -> list:
    return [chunk async for chunk in stream]


def test_chat_stream_chunks_join_to_the_answer() -> None:
    client, _ = _client(Reply("Hello there, é!"), Reply("Hello there, é!"))
    whole = run(client.chat.completions.create(messages=USER, logprobs=True))
    stream = run(
        client.chat.completions.create(
            messages=USER, stream=True, logprobs=True, stream_options={"include_usage": True}
        )
    )
    chunks = run(_collect(stream))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    lps = [lp.logprob for c in chunks if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert lps == client.cache[chunks[0].id].output_logprobs[:-1]  # every content token's, EOS excluded
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage
    assert len({c.id for c in chunks}) == 1 and chunks[0].id in client.cache


def test_chat_stream_tool_call_deltas() -> None:
    client, _ = _client(Reply("Sure.\n" + call_text(("add", '{"a": 1}'))))
    chunks = run(_collect(run(client.chat.completions.create(messages=USER, tools=TOOLS, stream=True))))
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Sure."
    (call,) = [t for d in deltas for t in d.tool_calls or []]
    assert call.index == 0 and call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, call.function.arguments) == ("add", '{"a": 1}')
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_text_completions_and_their_stream() -> None:
    client, engine = _client(Reply(" world"), Reply(" there"), Reply(" again"))
    out = run(client.completions.create(model="m", prompt="hello", max_tokens=5, logprobs=0))
    assert isinstance(out, Completion) and out.choices[0].text == " world"
    assert out.choices[0].logprobs.token_logprobs == engine.responses[0].output_logprobs[:-1]
    item = client.cache[out.id]
    assert item.message is None and item.prompt_ids == engine.requests[0].input_ids
    chunks = run(
        _collect(
            run(client.completions.create(prompt=[[5, 6], [7]], stream=True, stream_options={"include_usage": True}))
        )
    )
    assert [c.choices[0].text for c in chunks[:-1]] == [" there", " again"] and chunks[-1].usage.prompt_tokens == 3
    with pytest.raises(AgentRequestError) as err:
        run(client.completions.create(prompt="x", logprobs=2))
    assert err.value.param == "logprobs"
    with pytest.raises(AgentRequestError) as err:
        run(client.completions.create(prompt=[]))
    assert err.value.param == "prompt"
    with pytest.raises(AgentRequestError) as err:
        run(client.completions.create(prompt="x", echo=True))
    assert err.value.param == "echo"
