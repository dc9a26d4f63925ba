"""The proxy's refusals and their body, OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``.

A refusal is an :class:`~areal_tasks.errors.AgentRequestError` (the agent package's one exception
family) carrying the HTTP status it answers with: the session layer raises it without knowing
about HTTP, and the app turns it into a response (``app.py``). The official ``openai`` SDK reads
this shape into its ``APIStatusError`` subclasses (401 ``AuthenticationError``, 404
``NotFoundError``, 429 ``RateLimitError``...), with ``error.message`` as the exception's text.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from areal_tasks.errors import AgentRequestError

logger = logging.getLogger(__name__)

__all__ = ["ProxyRefusal", "error_body", "error_type"]


class ProxyRefusal(AgentRequestError):
    """A request the proxy refuses with HTTP ``status`` (``code`` is OpenAI's machine-readable code,
    ``retry_after_s`` a ``Retry-After`` hint for 429s)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.status = int(status)
        self.code = code
        self.retry_after_s = retry_after_s


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for a status: ``authentication_error``, ``not_found_error``,
    ``rate_limit_error``, ``invalid_request_error`` (other 4xx) or ``server_error``."""
    if status == HTTPStatus.UNAUTHORIZED:
        return "authentication_error"
    if status == HTTPStatus.NOT_FOUND:
        return "not_found_error"
    if status == HTTPStatus.TOO_MANY_REQUESTS:
        return "rate_limit_error"
    return "invalid_request_error" if status < HTTPStatus.INTERNAL_SERVER_ERROR else "server_error"


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The JSON body of an error answer (also the payload of a mid-stream error event)."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
