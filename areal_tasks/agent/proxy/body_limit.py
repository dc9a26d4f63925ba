"""Request bodies over ``ProxyLimits.max_body_bytes`` are refused with 413 as they arrive.

The proxy parses each body whole (JSON, on the event loop), so the limit sits below the app, as a
pure ASGI middleware like the embedded server's (``inference/server/body_limit.py``), answering in
OpenAI's error shape: a declared ``Content-Length`` over the limit is refused at once, a chunked
body when its running count passes the limit (raised from ``receive`` as :class:`ProxyRefusal`,
which the app answers).
"""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from areal_tasks.agent.proxy.errors import ProxyRefusal, error_body

logger = logging.getLogger(__name__)

__all__ = ["BodyLimitMiddleware"]


def _too_large(limit: int) -> str:
    return f"the request body is larger than this proxy's limit of {limit} bytes"


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
            problem, status = None, 413
            if not declared.strip().isdigit():
                problem, status = f"invalid Content-Length {declared[:40]!r}", 400
            elif int(declared) > limit:
                problem = _too_large(limit)
            if problem is not None:
                logger.warning("refused %s %s: %s", scope["method"], scope["path"], problem)
                await JSONResponse(error_body(problem, status), status_code=status)(scope, receive, send)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    logger.warning("refused %s %s: %s", scope["method"], scope["path"], _too_large(limit))
                    raise ProxyRefusal(413, _too_large(limit))
            return message

        await self.app(scope, counted, send)
