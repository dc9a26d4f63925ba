"""The front-end bridge in one event loop: the front end's ASGI app relays to a toy app over the socket.

Requests go in as uvicorn would hand them to the front end (scope, body chunks, a disconnect); the
toy app on the engine side sees what uvicorn would have given it, and its answers come back whole:
statuses, headers, bodies in chunks, streaming, a disconnect reaching a waiting handler, an app
that ends without an answer (500) or mid-answer (the front end raises, uvicorn cuts the
connection), the body bound, and the engine going away (503). The frame reader is checked against
split, oversized, malformed and truncated input.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.bridge_engine import BridgeServer
from areal_tasks.inference.server.bridge_frames import MAX_FRAME_BYTES, READY, read_frames
from areal_tasks.inference.server.frontend import EngineLink, FrontEndApp

MAX_BODY = 64


async def toy_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Routes by path (see the module doc); records what it saw on ``toy_app.seen``."""
    path = scope["path"]
    if path == "/echo":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        toy_app.seen.append(scope)
        if len(body) > MAX_BODY:
            await send({"type": "http.response.start", "status": 413, "headers": []})
            await send({"type": "http.response.body", "body": str(len(body)).encode()})
            return
        headers = [(b"x-method", scope["method"].encode()), (b"x-query", scope["query_string"])]
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"a", b"bb", b"ccc"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/wait":
        await receive()  # the body
        message = await receive()  # then nothing until the client leaves
        toy_app.seen.append(message)
    elif path == "/nothing":
        await receive()
    elif path == "/half":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("the handler failed mid-answer")


toy_app.seen = []  # type: ignore[attr-defined]


class Client:
    """One request through the front end as uvicorn would make it."""

    def __init__(self, chunks: list[bytes], leave_after_s: float | None = None) -> None:
        self.chunks = list(chunks)
        self.leave_after_s = leave_after_s
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.chunks:
            chunk = self.chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}
        if self.leave_after_s is None:
            await asyncio.Event().wait()  # never leaves
        await asyncio.sleep(self.leave_after_s)
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def scope_for(path: str, method: str = "POST", query: bytes = b"") -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(b"content-type", b"application/json"), (b"authorization", b"Bearer k")],
        "client": ("127.0.0.1", 5555),
        "scheme": "http",
        "http_version": "1.1",
    }


async def bridged(test: Any) -> None:
    toy_app.seen.clear()
    with tempfile.TemporaryDirectory() as tmp:
        lost: list[bool] = []
        bridge = BridgeServer(toy_app, str(Path(tmp) / "b.sock"), on_lost=lambda: lost.append(True))
        await bridge.start()
        link = EngineLink(bridge.path)
        await link.open()
        front = FrontEndApp(link, MAX_BODY)
        try:
            await test(front, bridge, link, lost)
        finally:
            await link.close()
            await bridge.close()


def test_a_request_reaches_the_app_as_uvicorn_would_give_it_and_its_answer_comes_back() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        link.send([READY, 0, ["127.0.0.1", 30000]])
        await asyncio.wait_for(bridge.ready.wait(), 5)
        client = Client([b'{"a":', b" 1}"])
        await asyncio.wait_for(front(scope_for("/echo", "PUT", b"x=1"), client.receive, client.send), 5)
        assert client.status == 201 and client.body == b'{"a": 1}'
        start = client.sent[0]
        assert [tuple(h) for h in start["headers"]] == [(b"x-method", b"PUT"), (b"x-query", b"x=1")]
        seen = toy_app.seen[0]
        assert seen["server"] == ("127.0.0.1", 30000) and seen["client"] == ("127.0.0.1", 5555)
        assert seen["headers"] == [(b"content-type", b"application/json"), (b"authorization", b"Bearer k")]
        assert seen["asgi"]["spec_version"] == "2.3" and seen["raw_path"] == b"/echo"
        assert bridge.in_flight == 0 and not lost

    asyncio.run(bridged(test))


def test_many_requests_at_once_each_get_their_own_answer() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        clients = [Client([str(i).encode()]) for i in range(200)]
        await asyncio.wait_for(asyncio.gather(*(front(scope_for("/echo"), c.receive, c.send) for c in clients)), 10)
        assert [c.body for c in clients] == [str(i).encode() for i in range(200)]

    asyncio.run(bridged(test))


def test_a_streamed_answer_arrives_in_its_chunks() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        client = Client([b""])
        await asyncio.wait_for(front(scope_for("/stream", "GET"), client.receive, client.send), 5)
        bodies = [m for m in client.sent if m["type"] == "http.response.body"]
        assert [(m["body"], m["more_body"]) for m in bodies] == [
            (b"a", True),
            (b"bb", True),
            (b"ccc", True),
            (b"", False),
        ]

    asyncio.run(bridged(test))


def test_a_client_that_leaves_is_reported_to_the_waiting_handler() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        client = Client([b""], leave_after_s=0.05)
        serving = asyncio.ensure_future(front(scope_for("/wait"), client.receive, client.send))
        for _ in range(200):
            if toy_app.seen:
                break
            await asyncio.sleep(0.01)
        assert toy_app.seen == [{"type": "http.disconnect"}]
        # the handler returned without an answer: the front end answers as uvicorn would
        await asyncio.wait_for(serving, 5)
        assert client.status == 500

    asyncio.run(bridged(test))


def test_an_app_that_answers_nothing_is_a_500_and_one_that_fails_mid_answer_cuts_it() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        client = Client([b""])
        await asyncio.wait_for(front(scope_for("/nothing"), client.receive, client.send), 5)
        assert client.status == 500 and client.body == b"Internal Server Error"
        client = Client([b""])
        with pytest.raises(InferenceError, match="before completing it"):
            await asyncio.wait_for(front(scope_for("/half"), client.receive, client.send), 5)
        assert client.status == 200 and client.body == b"part"

    asyncio.run(bridged(test))


def test_a_body_past_the_limit_is_forwarded_only_to_one_byte_more() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        client = Client([b"x" * 40, b"y" * 40, b"z" * 1000])
        await asyncio.wait_for(front(scope_for("/echo"), client.receive, client.send), 5)
        assert client.status == 413 and client.body == str(MAX_BODY + 1).encode()

    asyncio.run(bridged(test))


def test_the_engine_going_away_answers_503_in_flight_and_after() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        waiting = Client([b""])
        serving = asyncio.ensure_future(front(scope_for("/wait"), waiting.receive, waiting.send))
        await asyncio.sleep(0.05)
        gone: list[bool] = []
        link.on_lost = lambda: gone.append(True)
        await bridge.close()
        await asyncio.wait_for(serving, 5)
        assert waiting.status == 503 and b"unreachable" in waiting.body and gone == [True]
        later = Client([b"{}"])
        await front(scope_for("/echo"), later.receive, later.send)
        assert later.status == 503 and dict(later.sent[0]["headers"])[b"retry-after"] == b"5"

    asyncio.run(bridged(test))


def test_the_front_end_leaving_tells_the_engine_side() -> None:
    async def test(front: FrontEndApp, bridge: BridgeServer, link: EngineLink, lost: list) -> None:
        await link.close()
        for _ in range(200):
            if lost:
                break
            await asyncio.sleep(0.01)
        assert lost == [True]

    asyncio.run(bridged(test))


def frames_of(data: bytes, split: int) -> list[list[Any]]:
    async def run() -> list[list[Any]]:
        reader = asyncio.StreamReader()
        for start in range(0, len(data), split):
            reader.feed_data(data[start : start + split])
        reader.feed_eof()
        return [frame async for frame in read_frames(reader)]

    return asyncio.run(run())


def framed(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


@pytest.mark.parametrize("split", [1, 3, 7, 1000])
def test_frames_split_anywhere_read_back_whole(split: int) -> None:
    frames = [[1, i, b"x" * i, "text", None, [[b"a", b"b"]]] for i in range(20)]
    data = b"".join(framed(msgspec.msgpack.encode(f)) for f in frames)
    assert frames_of(data, split) == frames


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ((MAX_FRAME_BYTES + 1).to_bytes(4, "big"), "at most"),
        (framed(b"\xc1"), "not msgpack"),
        (framed(msgspec.msgpack.encode(7)), "not \\[kind, request"),
        (framed(msgspec.msgpack.encode([1])), "not \\[kind, request"),
        (framed(msgspec.msgpack.encode([1, 2]))[:-1], "ended inside a frame"),
    ],
)
def test_broken_frames_are_errors_that_say_what_was_wrong(data: bytes, message: str) -> None:
    with pytest.raises(InferenceError, match=message):
        frames_of(data, 1000)
