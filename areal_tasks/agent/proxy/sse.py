"""Server-Sent Events of a streamed completion, framed as OpenAI's API frames them.

Each chunk of the core client's stream iterator (``ChatCompletionChunk`` or ``Completion``
objects) becomes ``data: {json}\\n\\n``, and ``data: [DONE]\\n\\n`` ends a stream that finished.
A failure after the stream started cannot change the status any more: it becomes one event
carrying OpenAI's error body (the official SDK raises ``APIError`` with its message on it), and
the stream closes without ``[DONE]``.

:class:`SSEResponse` runs its ``on_close`` coroutine once the answer ends, however it ends
(finished, failed, client gone, or never started). It runs outside the response's cancel scope:
when the client leaves, Starlette cancels the body's scope (and with it every further ``await``
there), so the stream's generation is stopped and the session's request slot released from
``__call__``'s ``finally``, where awaiting still works.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from areal_tasks.agent.proxy.errors import ProxyRefusal, error_body
from areal_tasks.errors import AgentRequestError

logger = logging.getLogger(__name__)

__all__ = ["DONE", "SSEResponse", "sse", "sse_events", "to_json"]

DONE = b"data: [DONE]\n\n"
#: what ``next_chunk`` returns once the stream is exhausted.
END = object()


def to_json(obj: Any) -> Any:
    """An SDK object (pydantic) or plain data as JSON-ready data."""
    dump = getattr(obj, "model_dump", None)
    return dump(mode="json") if dump is not None else obj


def sse(payload: Any) -> bytes:
    """One event carrying ``payload`` (an SDK object or a dict) as JSON."""
    return b"data: " + json.dumps(to_json(payload), ensure_ascii=False).encode("utf-8") + b"\n\n"


def failure_event(exc: BaseException, where: str) -> bytes:
    """The error event of ``exc``, raised mid-stream (logged; a bug's text is not sent)."""
    if isinstance(exc, ProxyRefusal):
        return sse(error_body(str(exc), exc.status, exc.param, exc.code))
    if isinstance(exc, AgentRequestError):
        return sse(error_body(str(exc), 400, exc.param))
    logger.error("%s failed mid-stream", where, exc_info=exc)
    return sse(error_body(f"the generation failed: {type(exc).__name__}: {exc}", 500))


async def sse_events(
    first: Any, next_chunk: Callable[[], Awaitable[Any]], where: str = "a stream"
) -> AsyncIterator[bytes]:
    """The events of a stream whose first chunk is ``first`` (fetched before the answer started, so
    that a refusal is still an HTTP error) and whose later chunks ``next_chunk()`` returns until it
    returns :data:`END`."""
    if first is END:
        yield DONE
        return
    yield sse(first)
    while True:
        try:
            chunk = await next_chunk()
        except Exception as exc:  # noqa: BLE001 - becomes the stream's error event (logged there)
            yield failure_event(exc, where)
            return
        if chunk is END:
            break
        yield sse(chunk)
    yield DONE


class SSEResponse(StreamingResponse):
    """A streamed answer that awaits ``on_close()`` once it ends, however it ends (see the module doc)."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
