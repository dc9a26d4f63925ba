"""``HttpTransport``'s default backend (aiohttp) against a real HTTP server on loopback: answers
decoded as httpx decoded them, ``Retry-After``, keys and refusals, query values, the whole-call
deadline, a refused connection (never sent) against a cut one (maybe sent), and no unclosed-session
noise from a loop that ended without ``aclose``."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from areal_tasks.errors import InferenceConnectionError, InferenceTimeoutError
from areal_tasks.inference.client.http_backends import AiohttpBackend
from areal_tasks.inference.client.protocol import HttpCall
from areal_tasks.inference.client.transport import HttpTransport, may_have_reached_server


def _app(seen: list[dict[str, Any]]) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"auth": request.headers.get("Authorization"), "query": dict(request.query), "body": body})
        return web.json_response({"echo": body["input_ids"]})

    async def busy(_: web.Request) -> web.Response:
        return web.json_response({"error": "queue full"}, status=429, headers={"Retry-After": "3"})

    async def text(_: web.Request) -> web.Response:
        return web.Response(text="plain words")

    async def bad_json(_: web.Request) -> web.Response:
        return web.Response(text="{not json", content_type="application/json")

    async def refuse(_: web.Request) -> web.Response:
        return web.json_response({"detail": "bad key"}, status=401)

    async def pause(request: web.Request) -> web.Response:
        seen.append({"auth": request.headers.get("Authorization"), "query": dict(request.query)})
        return web.json_response({"ok": True})

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    async def cut(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()  # the request arrived; the connection dies before any answer
        return web.Response()

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_post("/busy", busy)
    app.router.add_get("/text", text)
    app.router.add_get("/bad_json", bad_json)
    app.router.add_get("/refuse", refuse)
    app.router.add_post("/pause_generation", pause)
    app.router.add_get("/slow", slow)
    app.router.add_get("/cut", cut)
    return app


def _serve(test: Callable[[str, HttpTransport, list[dict[str, Any]]], Awaitable[None]], **transport_args: Any) -> None:
    """Run ``test(url, transport, seen)`` with the app served on a free loopback port."""

    async def main() -> None:
        seen: list[dict[str, Any]] = []
        runner = web.AppRunner(_app(seen))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        transport = HttpTransport(max_connections=8, **transport_args)
        try:
            await test(f"http://127.0.0.1:{port}", transport, seen)
        finally:
            await transport.aclose()
            await runner.cleanup()

    asyncio.run(main())


def test_answers_decode_like_httpx_did() -> None:
    async def test(url: str, transport: HttpTransport, seen: list) -> None:
        assert isinstance(transport.backend(), AiohttpBackend)
        answers = await asyncio.gather(
            *(transport.send(url, HttpCall("POST", "/generate", {"input_ids": [i, 7]}), 10.0) for i in range(20))
        )
        assert answers == [(200, {"echo": [i, 7]}) for i in range(20)]
        assert await transport.send(url, HttpCall("GET", "/text"), 10.0) == (200, "plain words")
        assert await transport.send(url, HttpCall("GET", "/bad_json"), 10.0) == (200, "{not json")
        busy = await transport.exchange(url, HttpCall("POST", "/busy", {}), 10.0)
        assert (busy.status, busy.payload, busy.retry_after_s) == (429, {"error": "queue full"}, 3.0)

    _serve(test)


def test_keys_refusals_and_query_values() -> None:
    async def test(url: str, transport: HttpTransport, seen: list) -> None:
        await transport.send(url, HttpCall("POST", "/generate", {"input_ids": [1]}), 10.0)
        await transport.send(url, HttpCall("POST", "/pause_generation", {}, params={"abort": True, "n": 2}), 10.0)
        assert [s["auth"] for s in seen] == ["Bearer api-secret", "Bearer admin-secret"]
        assert seen[1]["query"] == {"abort": "true", "n": "2"}
        status, message = await transport.send(url, HttpCall("GET", "/refuse"), 10.0)
        assert status == 401 and "refused the API key" in message and "secret" not in message

    _serve(test, api_key="api-secret", admin_api_key="admin-secret")


def test_deadline_cut_connection_and_refused_connection() -> None:
    async def test(url: str, transport: HttpTransport, seen: list) -> None:
        with pytest.raises(InferenceTimeoutError, match="no answer within 0.3s") as timed_out:
            await transport.send(url, HttpCall("GET", "/slow"), 0.3)
        assert may_have_reached_server(timed_out.value)
        with pytest.raises(InferenceConnectionError) as cut:
            await transport.send(url, HttpCall("GET", "/cut"), 10.0)
        assert not isinstance(cut.value, InferenceTimeoutError) and may_have_reached_server(cut.value)
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with pytest.raises(InferenceConnectionError, match="/generate") as refused:
            await transport.send(closed, HttpCall("POST", "/generate", {"input_ids": [1]}), 10.0)
        assert not may_have_reached_server(refused.value)

    _serve(test)


def test_a_loop_that_ended_without_aclose_leaves_no_unclosed_session(caplog: pytest.LogCaptureFixture) -> None:
    transport = HttpTransport(max_connections=4)

    async def call(url: str) -> None:
        assert await transport.send(url, HttpCall("POST", "/generate", {"input_ids": [3]}), 10.0) == (
            200,
            {"echo": [3]},
        )

    async def serve_twice(url: str) -> None:  # the server's loop; the calls run on loops of their own
        await asyncio.to_thread(asyncio.run, call(url))  # no aclose: that loop's session is left open
        await asyncio.to_thread(asyncio.run, call(url))  # a new loop forgets the closed one's session

    async def main() -> None:
        runner = web.AppRunner(_app([]))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            await serve_twice(f"http://127.0.0.1:{runner.addresses[0][1]}")
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        assert len(transport._backends) <= 1
        gc.collect()
    assert not [r for r in caplog.records if "Unclosed" in r.getMessage()], caplog.text
