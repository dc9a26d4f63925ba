"""The proxy's OpenAI routes: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``.

Each completion request needs a session's key and is served by that session's ``ArealOpenAI``
client, so it is recorded in the session's cache. The body goes to the client as it came (the
client validates it and names a bad field in a 400). ``stream: true`` answers Server-Sent Events
(``sse.py``): the first chunk is fetched before the answer starts, so that a refusal is still an
HTTP error. A session request holds one of its slots (``ProxyLimits.max_concurrent_requests``)
until its answer ends. A client that leaves stops its own generation only: the non-streamed
request is raced against its disconnect (``inference/server/disconnect.py``), the streamed one
is cancelled by Starlette and closes its stream iterator.

``GET /v1/chat/completions/{id}`` returns a completion of the caller's own session (404, naming
only the id, for any other).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from areal_tasks.agent.proxy.app import ProxyContext, json_body
from areal_tasks.agent.proxy.auth import bearer
from areal_tasks.agent.proxy.errors import ProxyRefusal
from areal_tasks.agent.proxy.session import Session
from areal_tasks.agent.proxy.sse import END, SSEResponse, sse_events, to_json
from areal_tasks.agent.proxy.store import SessionStore
from areal_tasks.inference.server.disconnect import CLIENT_GONE, run_while_connected
from areal_tasks.inference.server.json_answer import JsonAnswer

logger = logging.getLogger(__name__)

__all__ = ["openai_router"]


def _create(session: Session, kind: str, body: dict[str, Any]) -> Any:
    """The client call's coroutine (a body field the client cannot take is a 400 naming it)."""
    api = session.client.chat.completions if kind == "chat" else session.client.completions
    try:
        return api.create(**body)
    except TypeError as exc:  # binding the arguments failed: the call has not started
        raise ProxyRefusal(400, f"invalid request body: {exc}") from None


def openai_router(ctx: ProxyContext) -> APIRouter:
    """The ``/v1`` routes of one proxy."""
    router = APIRouter()
    store = ctx.store

    def session_of(request: Request) -> Session:
        return store.authenticate(bearer(request.headers.get("authorization")))

    @router.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        token = bearer(request.headers.get("authorization"))
        if not ctx.admin.is_admin(token):
            store.authenticate(token)
        entry = {"id": ctx.model_name, "object": "model", "created": int(time.time()), "owned_by": "areal"}
        return {"object": "list", "data": [entry]}

    @router.get("/v1/chat/completions/{completion_id}")
    async def get_completion(completion_id: str, request: Request) -> Any:
        session = session_of(request)
        if completion_id not in session.cache:
            raise ProxyRefusal(
                404, f"no completion {completion_id!r} in this session", param="completion_id", code="not_found"
            )
        return JsonAnswer(to_json(session.cache[completion_id].completion))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _serve(request, "chat")

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, "completions")

    async def _serve(request: Request, kind: str) -> Response:
        session = session_of(request)
        body = await json_body(request)
        stream = body.get("stream", False)
        if stream is not None and not isinstance(stream, bool):
            raise ProxyRefusal(400, f"stream must be a boolean, got {type(stream).__name__}", param="stream")
        if stream:
            return await _stream(request, session, kind, body)
        async with store.request(session):
            connected, result = await run_while_connected(
                request.receive, store.run(session, _create(session, kind, body))
            )
        if not connected:
            return Response(status_code=CLIENT_GONE)
        return JsonAnswer(to_json(result))

    async def _stream(request: Request, session: Session, kind: str, body: dict[str, Any]) -> Response:
        slot = contextlib.AsyncExitStack()
        await slot.enter_async_context(store.request(session))
        stream = _Stream(store, session, slot)

        async def opening() -> Any:
            stream.iterator = await store.run(session, _create(session, kind, body))
            return await stream.next()

        try:
            connected, first = await run_while_connected(request.receive, opening())
        except BaseException:
            await stream.close()
            raise
        if not connected:
            await stream.close()
            return Response(status_code=CLIENT_GONE)
        return SSEResponse(sse_events(first, stream.next, where=f"session {session.id}"), on_close=stream.close)

    return router


class _Stream:
    """One streamed answer's iterator and the task pulling its next chunk (see :meth:`close`)."""

    def __init__(self, store: SessionStore, session: Session, slot: contextlib.AsyncExitStack) -> None:
        self.store = store
        self.session = session
        self.slot = slot
        self.iterator: Any = None
        self._pull: asyncio.Task[Any] | None = None

    async def _anext(self) -> Any:
        try:
            return await self.iterator.__anext__()
        except StopAsyncIteration:
            return END

    async def next(self) -> Any:
        """The next chunk, or :data:`END`; generated as one of the session's tasks."""
        self._pull = asyncio.ensure_future(self._anext())
        return await self.store.run(self.session, self._pull)

    async def close(self) -> None:
        """Stop the stream: wait out a pull being cancelled (an async generator cannot be closed while
        it runs), close the iterator (which stops its generation), free the request's slot."""
        try:
            pull = self._pull
            if pull is not None and not pull.done():
                pull.cancel()
                await asyncio.wait({pull})
            aclose = getattr(self.iterator, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # the slot is freed all the same; the failure is logged
                    logger.warning("session %s: closing a completion stream failed", self.session.id, exc_info=True)
        finally:
            await self.slot.aclose()
