"""The official ``openai`` SDK against the embedded server: streaming, ``n``, log-probs, refusals.

The session's ``areal serve`` process (``conftest.py``) answers: streamed chat and completions
reassemble to the non-streamed greedy answer (stop strings included), with the same log-probs as
the non-streamed answer and ``/generate``; ``n=3`` streams interleave three choices; usage comes
last with ``include_usage``; a client that closes its stream mid-way leaves the server idle; every
field the server cannot serve is a 400 naming it.
"""

from __future__ import annotations

import openai
import pytest
from server_metrics import busy, wait_idle

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "tell me a story"}]
PROMPT = [5, 6, 7, 8, 9]
GREEDY = {"temperature": 0, "max_tokens": 24, "extra_body": {"ignore_eos": True}}
#: the server must be idle this soon after a streaming client left (a bound, not a measurement)
IDLE_WITHIN_S = 5.0


@pytest.fixture(scope="module")
def client(server_url: str):
    with openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


def _chat_stream(chunks) -> dict[int, dict]:
    """Per choice index: its deltas' content, log-prob entries, roles and finish reason; plus usage."""
    out: dict = {}
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk"
        if not chunk.choices:
            out["usage"] = chunk.usage
        for choice in chunk.choices:
            got = out.setdefault(choice.index, {"content": "", "logprobs": [], "roles": [], "finish": None})
            assert got["finish"] is None, "a chunk after the finish"
            got["content"] += choice.delta.content or ""
            got["roles"] += [choice.delta.role] if choice.delta.role else []
            got["logprobs"] += choice.logprobs.content if choice.logprobs else []
            got["finish"] = choice.finish_reason
    return out


def test_streamed_chat_reassembles_the_greedy_answer(client) -> None:
    whole = client.chat.completions.create(model="m", messages=MESSAGES, logprobs=True, **GREEDY)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            logprobs=True,
            top_logprobs=0,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    got = _chat_stream(chunks)
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert got["usage"].model_dump() == whole.usage.model_dump()
    choice = whole.choices[0]
    assert got[0]["roles"] == ["assistant"] and got[0]["finish"] == choice.finish_reason == "length"
    assert got[0]["content"] == choice.message.content and len(choice.message.content) > 0
    streamed = [(e.token, e.bytes, e.top_logprobs) for e in got[0]["logprobs"]]
    assert streamed == [(e.token, e.bytes, []) for e in choice.logprobs.content]
    assert [e.logprob for e in got[0]["logprobs"]] == pytest.approx([e.logprob for e in choice.logprobs.content])
    # the bytes of the tokens are the text's (a token may hold part of a character)
    assert bytes(b for e in choice.logprobs.content for b in e.bytes).decode("utf-8", "replace") == (
        choice.message.content
    )


def test_streamed_completion_matches_the_answer_and_generate(client, http) -> None:
    whole = client.completions.create(model="m", prompt=PROMPT, logprobs=0, **GREEDY)
    chunks = list(client.completions.create(model="m", prompt=PROMPT, logprobs=0, stream=True, **GREEDY))
    assert all(c.object == "text_completion" for c in chunks) and chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].text for c in chunks)
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    answer = whole.choices[0]
    assert text == answer.text and tokens == answer.logprobs.tokens and offsets == answer.logprobs.text_offset
    assert values == pytest.approx(answer.logprobs.token_logprobs)
    native = http.post(
        "/generate",
        json={
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
            "return_logprob": True,
        },
    ).json()
    assert native["text"] == text
    assert values == pytest.approx([v for v, _, _ in native["meta_info"]["output_token_logprobs"]])


def test_streamed_text_stops_where_the_answer_stops(client) -> None:
    greedy = client.completions.create(model="m", prompt=PROMPT, **GREEDY).choices[0].text
    stop = greedy[len(greedy) // 2 :][:2]
    whole = client.completions.create(model="m", prompt=PROMPT, stop=[stop], **GREEDY).choices[0]
    chunks = list(client.completions.create(model="m", prompt=PROMPT, stop=[stop], stream=True, **GREEDY))
    assert whole.finish_reason == "stop" and stop not in whole.text
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_samples_streamed_interleave_by_index(client) -> None:
    body = {"model": "m", "messages": MESSAGES, "n": 3, "seed": 7, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(**body)
    assert [c.index for c in whole.choices] == [0, 1, 2] and whole.usage.completion_tokens == 36
    got = _chat_stream(client.chat.completions.create(stream=True, **body))
    assert sorted(got) == [0, 1, 2]
    for choice in whole.choices:
        assert got[choice.index]["content"] == choice.message.content
        assert got[choice.index]["roles"] == ["assistant"] and got[choice.index]["finish"] == "length"
    completions = client.completions.create(model="m", prompt=[PROMPT, PROMPT[:3]], n=2, max_tokens=3)
    assert [c.index for c in completions.choices] == [0, 1, 2, 3]


def test_a_client_leaving_mid_stream_aborts_its_generation(client, http) -> None:
    wait_idle(http, 30.0, "an idle server before the test")
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, n=32, max_tokens=2000, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    seen = 0
    for chunk in stream:
        seen += sum(1 for c in chunk.choices if c.delta.content)
        if seen >= 8:
            break
    assert busy(http) > 0, "the generation ended before the client left"
    stream.close()
    wait_idle(http, IDLE_WITHIN_S, "an idle server after the streaming client left")
    again = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3, extra_body={"ignore_eos": True})
    assert again.usage.completion_tokens == 3


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat", {"n": 0}, "n"),
        ("chat", {"n": 1000}, "n"),
        ("completions", {"n": -1}, "n"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("chat", {"top_logprobs": 0}, "top_logprobs"),
        ("chat", {"logprobs": 3}, "logprobs"),
        ("completions", {"logprobs": 6}, "logprobs"),
        ("completions", {"logprobs": True}, "logprobs"),
        ("completions", {"top_logprobs": 1}, "top_logprobs"),
        ("chat", {"stream_options": {"include_usage": True}}, "stream_options"),
        ("completions", {"stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
        ("completions", {"echo": True}, "echo"),
        # what would change the output but is not implemented is refused, never ignored
        ("chat", {"presence_penalty": 0.5}, "presence_penalty"),
        ("completions", {"frequency_penalty": -1.0}, "frequency_penalty"),
        ("chat", {"repetition_penalty": 1.2}, "repetition_penalty"),
        ("chat", {"logit_bias": {"5": 100}}, "logit_bias"),
        ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
        ("chat", {"guided_json": {"type": "object"}}, "guided_json"),
        ("completions", {"regex": "[a-z]+"}, "regex"),
        ("completions", {"suffix": "tail"}, "suffix"),
        ("completions", {"best_of": 3}, "best_of"),
        ("chat", {"min_tokens": 4}, "min_tokens"),
        ("chat", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_bad_values_are_400_naming_the_field(client, route, body, param) -> None:
    base = {"model": "m", "max_tokens": 2}
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            client.chat.completions.create(messages=MESSAGES, **base, extra_body=body)
        else:
            client.completions.create(prompt=PROMPT, **base, extra_body=body)
    error = refused.value
    assert error.status_code == 400 and error.param == param and param in error.message
    assert error.type == "invalid_request_error"


def test_unserved_fields_at_their_no_op_values_and_unknown_fields_are_accepted(client) -> None:
    """What frameworks send by default (zero penalties, a text response format, best_of equal to n)
    and fields that do not change the output (user, metadata) are served."""
    chat = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=2,
        presence_penalty=0,
        frequency_penalty=0.0,
        logit_bias={},
        response_format={"type": "text"},
        user="someone",
        extra_body={"repetition_penalty": 1.0, "metadata_note": "x", "min_tokens": 0},
    )
    assert chat.usage.completion_tokens <= 2
    text = client.completions.create(model="m", prompt=PROMPT, max_tokens=2, n=2, best_of=2, suffix="")
    assert len(text.choices) == 2
