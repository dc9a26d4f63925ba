"""Optional API keys, with SGLang's rules (``sglang/srt/utils/auth.py``).

* ``admin_api_key`` guards the admin endpoints (pause/continue, weight updates, weight-update
  groups, cache flush, abort): a request needs ``Authorization: Bearer <admin_api_key>``.
* ``api_key`` guards every endpoint; when no ``admin_api_key`` is set it also opens the admin ones.
* ``/health*``, ``/ready`` and ``/metrics`` are always open (probes and Prometheus scrapes).

A refused request gets 401 ``{"error": "Unauthorized"}``. Keys are compared in constant time.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

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


def request_allowed(path: str, method: str, header: str | None, api_key: str | None, admin_api_key: str | None) -> bool:
    """SGLang's decision for one request (see the module doc)."""
    if method == "OPTIONS" or path.startswith(_OPEN_PREFIXES):
        return True
    if path in ADMIN_PATHS:
        if admin_api_key:
            return _bearer_matches(header, admin_api_key)
        return _bearer_matches(header, api_key) if api_key else True
    return _bearer_matches(header, api_key) if api_key else True


def make_auth_middleware(
    api_key: str | None, admin_api_key: str | None
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """An HTTP middleware enforcing :func:`request_allowed`."""

    async def middleware(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        header = request.headers.get("Authorization")
        if not request_allowed(request.url.path, request.method, header, api_key, admin_api_key):
            logger.warning("refused %s %s: missing or wrong API key", request.method, request.url.path)
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        return await call_next(request)

    return middleware
