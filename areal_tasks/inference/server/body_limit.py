"""Request bodies larger than a ``max_body_bytes`` limit are refused with 413 as they arrive.

uvicorn reads any body it is sent, and FastAPI parses it whole (JSON, on the event loop) before a
handler sees it, so a body limit has to sit below both: a pure ASGI middleware (the shape of
``auth.py``'s, without Starlette's ``BaseHTTPMiddleware`` and its per-request task group). A
declared ``Content-Length`` over the limit is answered at once, without reading the body (an
invalid one with 400); a body sent in chunks is counted as it streams in and refused when it passes
the limit, by an exception raised from ``receive``, which the app answers.

The embedded server and the agent proxy (``agent/proxy/app.py``) both use it: each names itself in
the message and brings its own error body and the exception its app turns into a 413.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

__all__ = ["BodyLimitMiddleware", "BodyTooLargeError"]


class BodyTooLargeError(HTTPException):
    """A request body passed the limit while it streamed in (answered 413 by ``app.py``)."""


def _plain_error_body(message: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message}}


class BodyLimitMiddleware:
    """Refuse HTTP request bodies over ``max_body_bytes`` with 413 (see the module doc).

    ``holder`` names what refuses in the message ("this server's limit"); ``error_body(message,
    status)`` is the JSON of an answer given before the app runs; ``refusal(status, message)`` is the
    exception raised from ``receive`` once a streamed body passes the limit."""

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        *,
        holder: str = "server",
        error_body: Callable[[str, int], dict[str, Any]] = _plain_error_body,
        refusal: Callable[[int, str], Exception] = BodyTooLargeError,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.error_body = error_body
        self.refusal = refusal
        self.too_large = f"the request body is larger than this {holder}'s limit of {max_body_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            problem, status = None, 413
            if not declared.strip().isdigit():
                problem, status = f"invalid Content-Length {declared[:40]!r}", 400
            elif int(declared) > limit:
                problem = self.too_large
            if problem is not None:
                logger.warning("refused %s %s: %s", scope["method"], scope["path"], problem)
                await JSONResponse(self.error_body(problem, status), status_code=status)(scope, receive, send)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    logger.warning("refused %s %s: %s", scope["method"], scope["path"], self.too_large)
                    raise self.refusal(413, self.too_large)
            return message

        await self.app(scope, counted, send)
