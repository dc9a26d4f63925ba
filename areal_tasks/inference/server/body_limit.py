"""Request bodies larger than the server's ``max_body_bytes`` are refused with 413 as they arrive.

uvicorn reads any body it is sent, and FastAPI parses it whole (JSON, on the event loop) before a
handler sees it, so a body limit has to sit below both: a pure ASGI middleware (the shape of
``auth.py``'s, without Starlette's ``BaseHTTPMiddleware`` and its per-request task group). A
declared ``Content-Length`` over the limit is answered at once, without reading the body; a body
sent in chunks is counted as it streams in and refused when it passes the limit (raised as a 413
``HTTPException`` from ``receive``, which FastAPI passes on while it reads a body).
"""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

__all__ = ["BodyLimitMiddleware", "BodyTooLargeError"]


class BodyTooLargeError(HTTPException):
    """A request body passed the limit while it streamed in (answered 413 by ``app.py``)."""


def _too_large(limit: int) -> str:
    return f"the request body is larger than this server's limit of {limit} bytes"


class BodyLimitMiddleware:
    """Refuse HTTP request bodies over ``max_body_bytes`` with 413 (see the module doc)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            problem = None
            if not declared.strip().isdigit():
                problem, status = f"invalid Content-Length {declared[:40]!r}", 400
            elif int(declared) > limit:
                problem, status = _too_large(limit), 413
            if problem is not None:
                logger.warning("refused %s %s: %s", scope["method"], scope["path"], problem)
                await JSONResponse({"error": {"message": problem}}, status_code=status)(scope, receive, send)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    logger.warning("refused %s %s: %s", scope["method"], scope["path"], _too_large(limit))
                    raise BodyTooLargeError(413, _too_large(limit))
            return message

        await self.app(scope, counted, send)
