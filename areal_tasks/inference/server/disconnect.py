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
    ``(True, result)``, or ``(False, None)`` once ``work`` was cancelled. ``work``'s errors propagate,
    and so does a cancellation of the caller's own task (a server stopping).

    ``work`` runs in the caller's task; one watcher task reads ``receive`` and cancels the caller's
    task when the client leaves (one task a request, not two and an ``asyncio.wait``: this runs for
    every ``/generate`` call, on the event loop the engine thread shares the interpreter lock with)."""
    task = asyncio.current_task()
    if task is None:  # not in a task (never so under an ASGI server): nothing to cancel, no watching
        return True, await work
    left = False

    async def watch() -> None:
        nonlocal left
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # a receive that fails tells nothing: the work goes on to its end
            logger.warning("watching a request for its client's disconnect failed", exc_info=True)
            return
        left = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        # ours alone: the client left and nobody else cancelled the caller (uncancel counts the requests)
        if left and task.uncancel() == 0:
            return False, None
        raise
    finally:
        watcher.cancel()
    return True, result


async def while_connected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s answer, or a bare :data:`CLIENT_GONE` response when the client left first."""
    connected, result = await run_while_connected(request.receive, work)
    return result if connected else Response(status_code=CLIENT_GONE)
