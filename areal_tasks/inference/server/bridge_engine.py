"""The engine process's end of the front-end bridge: each bridged request answered by the server's app.

:class:`BridgeServer` listens on a Unix socket in a private directory. For every ``REQUEST`` frame
from the HTTP front end (``frontend.py``; the format is ``bridge_frames.py``) it builds the ASGI
scope uvicorn would have built and runs the server's own ASGI app on it in a task, as uvicorn
does: the same middleware (API keys, body limit), routes, errors and streaming. The app's
``receive`` yields the body chunks the front end forwards, then waits; it yields
``http.disconnect`` once the front end reports that the client went away, so a generation whose
client left is cancelled here as it is in one process (``disconnect.py``). Its ``send`` turns
response events into ``START`` and ``CHUNK`` frames; an app that returns (or fails) without
completing its response ends the exchange with ``ABORT``, and the front end answers 500 or cuts
the connection as uvicorn would.

What stays in this process per request is the app's own work and two msgpack frames; the HTTP
parsing, the connections and the socket writes are the front end's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.bridge_frames import (
    ABORT,
    BODY,
    CHUNK,
    DISCONNECT,
    READY,
    REQUEST,
    START,
    FrameWriter,
    read_frames,
)

logger = logging.getLogger(__name__)

__all__ = ["BridgeServer"]

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]
_ASGI = {"version": "3.0", "spec_version": "2.3"}  # as uvicorn says: apps listen for http.disconnect
_DISCONNECT = {"type": "http.disconnect"}


class _Exchange:
    """One bridged request: the body chunks not yet received, and whether its client left."""

    __slots__ = ("_waiter", "chunks", "complete", "gone", "rid", "started")

    def __init__(self, rid: int, body: bytes, more_body: bool) -> None:
        self.rid = rid
        self.chunks: list[dict[str, Any]] = [{"type": "http.request", "body": body, "more_body": more_body}]
        self.gone = False
        self.started = False
        self.complete = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, message: dict[str, Any] | None) -> None:
        """A body chunk, or None: the client went away."""
        if message is None:
            self.gone = True
        else:
            self.chunks.append(message)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def receive(self) -> dict[str, Any]:
        while True:
            if self.chunks:
                return self.chunks.pop(0)
            if self.gone or self.complete:
                return _DISCONNECT
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class BridgeServer:
    """Answers the front end's bridged requests with ``app`` (see the module doc)."""

    def __init__(self, app: ASGIApp, path: str, on_lost: Callable[[], None]) -> None:
        self.app = app
        self.path = path
        self._on_lost = on_lost
        self._server: asyncio.base_events.Server | None = None
        self._writer: FrameWriter | None = None
        self._exchanges: dict[int, _Exchange] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.ready = asyncio.Event()
        self.server_address: tuple[str, int] | None = None
        self._closing = False

    async def start(self) -> None:
        """Listen on :attr:`path` (one front end connects)."""
        self._server = await asyncio.start_unix_server(self._connected, path=self.path)

    @property
    def in_flight(self) -> int:
        """Bridged requests whose app has not returned."""
        return len(self._exchanges)

    async def close(self) -> None:
        """Stop listening, cancel the requests still running and close the front end's stream."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._writer is not None:  # the private socket has one client; a second is refused
            logger.error("a second connection to the front-end bridge was refused")
            writer.close()
            return
        self._writer = FrameWriter(writer)
        try:
            async for frame in read_frames(reader):
                self._dispatch(frame)
        except (InferenceError, ConnectionError) as exc:
            logger.error("the HTTP front end's bridge failed: %s", exc)
        except Exception:  # a frame of the wrong shape: a bug on one side, and this stream is over
            logger.exception("the HTTP front end's bridge failed on a frame")
        finally:
            self._writer.closed = True
            for exchange in self._exchanges.values():
                exchange.push(None)  # their clients are unreachable now
            if not self._closing:
                self._on_lost()

    def _dispatch(self, frame: list[Any]) -> None:
        kind, rid = frame[0], frame[1]
        if kind == REQUEST:
            self._begin(rid, frame)
        elif kind == BODY:
            if (exchange := self._exchanges.get(rid)) is not None:
                exchange.push({"type": "http.request", "body": frame[2], "more_body": frame[3]})
        elif kind == DISCONNECT:
            if (exchange := self._exchanges.get(rid)) is not None:
                exchange.push(None)
        elif kind == READY:
            self.server_address = tuple(frame[2]) if frame[2] else None
            self.ready.set()
        else:
            raise InferenceError(f"a bridge frame of unknown kind {kind!r} from the front end")

    def _begin(self, rid: int, frame: list[Any]) -> None:
        _, _, method, path, raw_path, query, headers, client, scheme, http_version, body, more_body = frame
        scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": http_version,
            "server": self.server_address,
            "client": tuple(client) if client else None,
            "scheme": scheme,
            "method": method,
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": [(name, value) for name, value in headers],
            "state": {},
        }
        exchange = _Exchange(rid, body, more_body)
        self._exchanges[rid] = exchange
        task = asyncio.ensure_future(self._serve(scope, exchange))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, scope: dict[str, Any], exchange: _Exchange) -> None:
        writer = self._writer
        assert writer is not None
        rid = exchange.rid

        async def send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                exchange.started = True
                writer.send([START, rid, message["status"], [list(pair) for pair in message.get("headers", ())]])
            elif kind == "http.response.body":
                more = bool(message.get("more_body", False))
                writer.send([CHUNK, rid, bytes(message.get("body", b"")), more])
                if not more:
                    exchange.complete = True

        try:
            await self.app(scope, exchange.receive, send)
        except asyncio.CancelledError:
            raise
        except Exception:  # the app's own error answer (500) went out already when it started one
            logger.exception("a bridged request to %s failed", scope["path"])
        finally:
            self._exchanges.pop(rid, None)
            if not exchange.complete and not self._closing:  # closing: the stream's end tells the front end (503)
                writer.send([ABORT, rid])
