"""The wire between ``areal serve``'s HTTP front-end process and its engine process.

With ``--http-frontend process`` the HTTP parsing, connections and response writing of the
embedded server run in a child process (``frontend.py``), off the interpreter lock that the engine
thread shares with the event loop; the child hands each request's ASGI events to the engine process
over one Unix socket (``bridge_engine.py``), where the server's own ASGI app answers them. This
module is that socket's format: frames of a 4-byte big-endian length and a msgpack array whose
first two items are the frame's kind and the request's number.

Front end to engine: ``REQUEST`` (the scope's fields and the first body chunk), ``BODY`` (a further
chunk), ``DISCONNECT`` (the client went away). Engine to front end: ``START`` (status, headers),
``CHUNK`` (body, more to come), ``ABORT`` (the app ended without completing its response), and
``READY`` once (request number 0) from the front end when it accepts connections.

Writes are gathered and sent once per event-loop turn (:class:`FrameWriter`): a burst of 1,024
answers is a few ``send`` calls, not 2,048.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from areal_tasks.errors import InferenceError

__all__ = [
    "ABORT",
    "BODY",
    "CHUNK",
    "DISCONNECT",
    "MAX_FRAME_BYTES",
    "READY",
    "REQUEST",
    "START",
    "FrameWriter",
    "read_frames",
]

REQUEST, BODY, DISCONNECT, START, CHUNK, ABORT, READY = range(1, 8)

#: a frame larger than this is a broken peer, not a request (bodies are bounded far below it).
MAX_FRAME_BYTES = 1 << 30
_READ_SIZE = 1 << 18

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


class FrameWriter:
    """Frames queued on one stream and written together at the end of the loop's turn."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()
        self.closed = False

    def send(self, frame: list[Any]) -> None:
        """Queue ``frame`` (dropped once the stream is closed: its peer is gone)."""
        if self.closed:
            return
        payload = _encode(frame)
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(len(payload).to_bytes(4, "big"))
        self._pending.append(payload)

    def _flush(self) -> None:
        if self.closed or not self._pending:
            self._pending.clear()
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if self._writer.is_closing():
            self.closed = True
            return
        self._writer.write(data)

    async def drain(self) -> None:
        """Write what is queued and wait until the transport took it."""
        self._flush()
        if not self.closed and not self._writer.is_closing():
            await self._writer.drain()

    def close(self) -> None:
        """Write what is queued, then close the stream."""
        self._flush()
        self.closed = True
        self._writer.close()


async def read_frames(reader: asyncio.StreamReader) -> AsyncIterator[list[Any]]:
    """Every frame of ``reader`` until its end; a malformed frame is an :class:`InferenceError`."""
    buffer = bytearray()
    while True:
        data = await reader.read(_READ_SIZE)
        if not data:
            if buffer:
                raise InferenceError(f"the bridge stream ended inside a frame ({len(buffer)} bytes left)")
            return
        buffer += data
        start = 0
        view = memoryview(buffer)
        try:
            while len(buffer) - start >= 4:
                size = int.from_bytes(view[start : start + 4], "big")
                if size > MAX_FRAME_BYTES:
                    raise InferenceError(f"a bridge frame of {size} bytes (at most {MAX_FRAME_BYTES})")
                end = start + 4 + size
                if end > len(buffer):
                    break
                try:
                    frame = _decode(view[start + 4 : end])
                except msgspec.DecodeError as exc:
                    raise InferenceError(f"a bridge frame that is not msgpack: {exc}") from exc
                if not isinstance(frame, list) or len(frame) < 2:
                    raise InferenceError(f"a bridge frame that is not [kind, request, ...]: {frame!r:.200}")
                yield frame
                start = end
        finally:
            view.release()
        del buffer[:start]
