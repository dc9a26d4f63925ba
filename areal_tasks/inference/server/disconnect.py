"""A generation whose HTTP client went away stops: its handler is cancelled, and so its sequences.

Starlette does not cancel a handler when its client disconnects: without this, a client that gave
up left its sequences queued and decoding for nobody (a flood of ``n=20000`` then held every later
request up). :func:`run_while_connected` races the handler's work against the request's ASGI
``receive``, which yields ``http.disconnect`` once the body has been read and the client is gone
(vLLM's ``with_cancellation`` does the same); the cancelled generation aborts its sequences in the
engine (``service.py``). Used by ``/generate``, ``/v1/completions`` and ``/v1/chat/completions``;
a streamed answer is cancelled by Starlette itself when its client leaves (``openai_stream.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

logger = logging.getLogger(__name__)

__all__ = ["CLIENT_GONE", "run_while_connected", "while_connected"]

T = TypeVar("T")

#: what a handler answers when its client went away first (nginx's "client closed request"; nobody reads it).
CLIENT_GONE = 499


async def run_while_connected(
    receive: Callable[[], Awaitable[dict[str, Any]]], work: Awaitable[T]
) -> tuple[bool, T | None]:
    """Run ``work`` until it finishes or the client disconnects, whichever comes first: returns
    ``(True, result)``, or ``(False, None)`` once ``work`` was cancelled. ``work``'s errors propagate."""

    async def disconnected() -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # a receive that fails tells nothing: the work goes on to its end
            logger.warning("watching a request for its client's disconnect failed", exc_info=True)
            await asyncio.Event().wait()

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this coroutine is cancelled itself
        if not task.done():
            task.cancel()
        watcher.cancel()
    if task.done() and not task.cancelled():
        return True, task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False, None


async def while_connected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s answer, or a bare :data:`CLIENT_GONE` response when the client left first."""
    connected, result = await run_while_connected(request.receive, work)
    return result if connected else Response(status_code=CLIENT_GONE)
