"""``areal serve``'s HTTP front-end process (``--http-frontend process``).

The engine thread and the HTTP event loop of one process share one interpreter lock, and every
torch call the engine makes gives the lock up and waits to get it back while the loop runs Python
(``benchmarks/gil_convoy.py``). This process takes the HTTP side off that lock: uvicorn parses the
requests, holds the connections and writes the answers here, and each request's ASGI events go to
the engine process over one Unix socket (``bridge_frames.py``), where the server's own app answers
them (``bridge_engine.py``). So every route, status, header and error is the app's; this process
adds none, except a 503 while the engine process is unreachable.

A body is forwarded as it arrives, up to ``--max-body-bytes`` and one byte more (enough for the
app's 413); the rest is read and dropped. A client that goes away is reported to the engine, which
cancels its generation. The process ends when the engine's stream ends (the engine process
stopped or died) or on SIGTERM/SIGINT, after the requests in flight (bounded). The engine process
starts it (``frontend_process.py``) and passes no secrets: API keys are checked by the app.

Usage (by the engine process)::

    python -m areal_tasks.inference.server.frontend --bridge PATH --host H --port P
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
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
from areal_tasks.inference.server.shutdown import STOP_SIGNALS

logger = logging.getLogger(__name__)

__all__ = ["EngineLink", "FrontEndApp", "main"]

_LOST = ("lost",)
_UNREACHABLE = b'{"error":{"message":"the engine process is unreachable","type":"ServiceUnavailable","code":503}}'


class EngineLink:
    """The front end's one stream to the engine process, shared by every request."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._writer: FrameWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._channels: dict[int, asyncio.Queue[Any]] = {}
        self._ids = itertools.count(1)
        self.alive = False
        self.on_lost: Callable[[], None] | None = None

    async def open(self) -> None:
        """Connect to the engine's bridge socket; InferenceError when it does not answer."""
        try:
            reader, writer = await asyncio.open_unix_connection(self.path)
        except OSError as exc:
            raise InferenceError(f"the engine's bridge socket {self.path} does not answer: {exc}") from exc
        self._writer = FrameWriter(writer)
        self.alive = True
        self._reader_task = asyncio.ensure_future(self._read(reader))

    def send(self, frame: list[Any]) -> None:
        assert self._writer is not None
        self._writer.send(frame)

    def open_channel(self) -> tuple[int, asyncio.Queue[Any]]:
        """A new request number and the queue its response frames arrive on."""
        rid = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._channels[rid] = queue
        return rid, queue

    def close_channel(self, rid: int) -> None:
        self._channels.pop(rid, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            async for frame in read_frames(reader):
                if (queue := self._channels.get(frame[1])) is not None:
                    queue.put_nowait(frame)
        except (InferenceError, ConnectionError) as exc:
            logger.error("the engine's bridge stream failed: %s", exc)
        except Exception:  # a frame of the wrong shape: a bug on one side, and this stream is over
            logger.exception("the engine's bridge stream failed on a frame")
        finally:
            self.alive = False
            if self._writer is not None:
                self._writer.closed = True
            for queue in self._channels.values():
                queue.put_nowait(_LOST)
            if self.on_lost is not None:
                self.on_lost()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task


class FrontEndApp:
    """The ASGI app of the front end: each HTTP request relayed over :class:`EngineLink`."""

    def __init__(self, link: EngineLink, max_body_bytes: int) -> None:
        self.link = link
        self.max_body_bytes = max_body_bytes

    async def __call__(
        self,
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[dict[str, Any]]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":  # the engine's app has no websocket routes
            await send({"type": "websocket.close", "code": 1000})
            return
        if not self.link.alive:
            await _unreachable(send)
            return
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        forwarded = len(body)
        rid, channel = self.link.open_channel()
        client = scope.get("client")
        self.link.send(
            [
                REQUEST,
                rid,
                scope["method"],
                scope["path"],
                scope.get("raw_path") or scope["path"].encode(),
                scope.get("query_string", b""),
                [[name, value] for name, value in scope["headers"]],
                list(client) if client else None,
                scope.get("scheme", "http"),
                scope.get("http_version", "1.1"),
                body,
                more,
            ]
        )
        pump = asyncio.ensure_future(self._pump(rid, receive, more, forwarded))
        try:
            await self._respond(channel, send)
        finally:
            pump.cancel()
            self.link.close_channel(rid)

    async def _pump(
        self, rid: int, receive: Callable[[], Awaitable[dict[str, Any]]], more: bool, forwarded: int
    ) -> None:
        """The rest of the body (bounded), then the client's disconnect, to the engine."""
        limit = self.max_body_bytes + 1
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if self.link.alive:
                    self.link.send([DISCONNECT, rid])
                return
            if not more:
                continue
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if forwarded >= limit:
                continue  # past the limit: the app answers 413 with what it has
            chunk = chunk[: limit - forwarded]
            forwarded += len(chunk)
            self.link.send([BODY, rid, chunk, more if forwarded < limit else False])

    async def _respond(self, channel: asyncio.Queue[Any], send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        started = False
        while True:
            frame = await channel.get()
            kind = frame[0]
            if kind == START:
                started = True
                await send({"type": "http.response.start", "status": frame[2], "headers": frame[3]})
            elif kind == CHUNK:
                await send({"type": "http.response.body", "body": frame[2], "more_body": frame[3]})
                if not frame[3]:
                    return
            elif frame is _LOST or kind == ABORT:
                if started:  # uvicorn cuts the connection: the client sees an incomplete answer
                    raise InferenceError("the engine ended a response before completing it")
                if frame is _LOST:
                    await _unreachable(send)
                else:
                    await _server_error(send)
                return


async def _lifespan(
    receive: Callable[[], Awaitable[dict[str, Any]]], send: Callable[[dict[str, Any]], Awaitable[None]]
) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _unreachable(send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    headers = [(b"content-type", b"application/json"), (b"retry-after", b"5")]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": _UNREACHABLE})


async def _server_error(send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    await send({"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"Internal Server Error"})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="areal serve's HTTP front-end process (started by areal serve)")
    parser.add_argument("--bridge", required=True, help="the engine process's bridge socket")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-body-bytes", type=int, required=True)
    parser.add_argument("--shutdown-timeout-s", type=float, default=15.0)
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT or until the engine's stream ends; 1 when it cannot start."""
    import uvicorn

    from areal_tasks.gc_heap import freeze_startup_heap

    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s [front end] %(name)s: %(message)s"
    )
    link = EngineLink(args.bridge)
    config = uvicorn.Config(
        FrontEndApp(link, args.max_body_bytes),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=75,
        timeout_graceful_shutdown=max(1, round(args.shutdown_timeout_s / 3)),
    )

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """uvicorn's handlers while serving, without raising the signal again once stopped
            (uvicorn does, so a Ctrl-C to the process group ended this process with a
            KeyboardInterrupt traceback), and stop signals ignored after."""
            for sig in STOP_SIGNALS:
                signal.signal(sig, self.handle_exit)
            try:
                yield
            finally:  # stopped: a later signal (the engine's stop, after a Ctrl-C) changes nothing
                for sig in STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_IGN)

        async def startup(self, sockets: Any = None) -> None:
            await link.open()
            await super().startup(sockets)
            if self.started and not link.alive:  # the engine went away while this one started
                self.should_exit = True
            elif self.started:
                bound = self.servers[0].sockets[0].getsockname()[:2] if self.servers else None
                link.send([READY, 0, list(bound) if bound else None])

    server = _Server(config)

    def engine_gone() -> None:
        if server.started and not server.should_exit:
            logger.error("the engine process's stream ended: stopping the front end")
            server.should_exit = True

    link.on_lost = engine_gone
    freeze_startup_heap()
    try:
        server.run()
    except InferenceError as exc:
        logger.error("%s", exc)
        return 1
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
