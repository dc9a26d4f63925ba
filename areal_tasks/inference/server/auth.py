"""API keys, with SGLang's rules (``sglang/srt/utils/auth.py``), and admin endpoints closed by default.

* ``admin_api_key`` guards the admin endpoints (pause/continue, weight updates, weight-update
  groups, cache flush, abort): a request needs ``Authorization: Bearer <admin_api_key>``.
* ``api_key`` guards every endpoint; when no ``admin_api_key`` is set it also opens the admin ones.
* With neither key, the admin endpoints are refused, unless ``open_admin`` (``areal serve
  --allow-unauthenticated-admin``); SGLang opens them. Whoever can reach a keyless server could
  otherwise pause it or load weights into it.
* ``/health*``, ``/ready`` and ``/metrics`` are always open (probes and Prometheus scrapes).

A refused request gets 401 ``{"error": "Unauthorized"}``. Keys are compared in constant time.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from areal_tasks.inference.admin_paths import EMBEDDED_ADMIN_PATHS

logger = logging.getLogger(__name__)

#: endpoints SGLang marks ``ADMIN_OPTIONAL``, plus the server's ``/areal/swap_weights`` (shared with the client).
ADMIN_PATHS: frozenset[str] = EMBEDDED_ADMIN_PATHS
_OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def _bearer_matches(header: str | None, key: str) -> bool:
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), key.encode())


def request_allowed(
    path: str,
    method: str,
    header: str | None,
    api_key: str | None,
    admin_api_key: str | None,
    open_admin: bool = False,
) -> bool:
    """The decision for one request (see the module doc)."""
    if method == "OPTIONS" or path.startswith(_OPEN_PREFIXES):
        return True
    if path in ADMIN_PATHS:
        if admin_api_key:
            return _bearer_matches(header, admin_api_key)
        return _bearer_matches(header, api_key) if api_key else open_admin
    return _bearer_matches(header, api_key) if api_key else True


def install_api_keys(app: Any, api_key: str | None, admin_api_key: str | None, open_admin: bool) -> None:
    """Add :class:`ApiKeyMiddleware` to ``app`` unless every request would pass (no key and
    ``open_admin``): the keyless, open server pays nothing per request."""
    if api_key or admin_api_key or not open_admin:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, admin_api_key=admin_api_key, open_admin=open_admin)


class ApiKeyMiddleware:
    """A pure ASGI middleware enforcing :func:`request_allowed` on HTTP requests.

    Not a ``@app.middleware("http")`` function: Starlette runs those through ``BaseHTTPMiddleware``,
    which wraps every request in a task group and memory streams, a cost each ``/generate`` call paid
    even with no key configured (see :func:`install_api_keys`, which leaves it out when it would pass
    every request)."""

    def __init__(self, app: ASGIApp, api_key: str | None, admin_api_key: str | None, open_admin: bool = False) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.open_admin = open_admin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # without api_key only the admin endpoints are guarded: every other request (each
        # /generate call) passes without its headers being read
        if scope["type"] == "http" and (self.api_key or scope["path"] in ADMIN_PATHS):
            header = Headers(scope=scope).get("Authorization")
            allowed = request_allowed(
                scope["path"], scope["method"], header, self.api_key, self.admin_api_key, self.open_admin
            )
            if not allowed:
                logger.warning("refused %s %s: missing or wrong API key", scope["method"], scope["path"])
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
