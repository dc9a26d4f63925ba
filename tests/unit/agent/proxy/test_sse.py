"""SSE framing of a streamed answer: ``data: {json}`` events then ``[DONE]``; a failure after the
stream started is one error event in OpenAI's shape and the stream ends without ``[DONE]``."""

from __future__ import annotations

import asyncio
import json

from openai.types.chat import ChatCompletionChunk

from areal_tasks.agent.proxy.errors import ProxyRefusal
from areal_tasks.agent.proxy.sse import DONE, END, sse_events
from areal_tasks.errors import AgentRequestError


def chunk(text: str) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id="chatcmpl-1",
        object="chat.completion.chunk",
        created=0,
        model="m",
        choices=[{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    )


def events(first: object, rest: list[object]) -> list[bytes]:
    async def collect() -> list[bytes]:
        items = iter(rest)

        async def next_chunk() -> object:
            item = next(items, END)
            if isinstance(item, BaseException):
                raise item
            return item

        return [event async for event in sse_events(first, next_chunk)]

    return asyncio.run(collect())


def payload(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:])


def test_chunks_are_events_and_done_ends_the_stream() -> None:
    out = events(chunk("a"), [chunk("b")])
    assert [payload(e)["choices"][0]["delta"]["content"] for e in out[:2]] == ["a", "b"]
    assert out[-1] == DONE and events(END, []) == [DONE]


def test_a_failure_mid_stream_is_an_error_event_without_done() -> None:
    for exc, status_type, param in (
        (RuntimeError("boom"), "server_error", None),
        (AgentRequestError("bad field", param="stop"), "invalid_request_error", "stop"),
        (ProxyRefusal(409, "session ended"), "invalid_request_error", None),
    ):
        out = events(chunk("a"), [exc, chunk("never")])
        assert len(out) == 2 and DONE not in out
        error = payload(out[1])["error"]
        assert (
            error["type"] == status_type
            and error["param"] == param
            and set(error) == {"message", "type", "param", "code"}
        )
