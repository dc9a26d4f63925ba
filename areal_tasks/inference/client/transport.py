"""``HttpTransport``: executes an adapter's :class:`~.protocol.HttpCall` against one server.

``httpx.AsyncClient`` pools per running event loop (so blocking helpers that run their own loop
work), a total deadline per call, and transport failures turned into the client's error types:
:class:`~areal_tasks.errors.InferenceTimeoutError` and
:class:`~areal_tasks.errors.InferenceConnectionError`. HTTP error statuses are returned, not raised:
what they mean is for the core and the adapter to judge.

The connections themselves are ``http_backends.py``'s: an ``aiohttp`` session per running event
loop by default (a tenth of httpx's host time a call), sharded ``httpx`` pools when a caller gives
an ``httpx`` transport factory (tests serve fake servers in process through ``httpx.MockTransport``).

API keys: every call carries ``Authorization: Bearer <key>`` when the transport has a key; calls
to :data:`ADMIN_PATHS` (pause/resume, weight updates, aborts) carry the admin key when one is set,
else the API key (the rule of SGLang and the embedded server, see ``server/auth.py``). A 401/403
answer comes back with a payload that says which key was sent (or that none was) and which setting
to fix; the keys themselves are never logged nor put in a message.

A ``Retry-After`` header (a 429 from a server whose queue is full) comes back with the answer of
:meth:`HttpTransport.exchange` as seconds (:func:`retry_after_s`), so the core can wait that long.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import msgspec

from areal_tasks.errors import InferenceConnectionError
from areal_tasks.inference.admin_paths import EMBEDDED_ADMIN_PATHS
from areal_tasks.inference.client.http_backends import (
    KEEPALIVE_EXPIRY_S,
    POOL_CONNECTIONS,
    AiohttpBackend,
    HttpBackend,
    HttpxBackend,
    Request,
    never_sent,
    tls_context,
)
from areal_tasks.inference.client.protocol import HttpCall

logger = logging.getLogger(__name__)

__all__ = [
    "ADMIN_PATHS",
    "KEEPALIVE_EXPIRY_S",
    "POOL_CONNECTIONS",
    "Answer",
    "HttpTransport",
    "choose_key",
    "decode_reply",
    "may_have_reached_server",
    "refusal_message",
    "retry_after_s",
    "tls_context",
]


def decode_reply(url: str, headers: Mapping[str, str], body: bytes) -> Any:
    """A reply's body: parsed JSON when it says it is JSON, else its text. msgspec reads a
    ``/generate`` answer's log-probs 4x faster than ``json`` (30 against 120 us for 256 tokens);
    what it refuses (``NaN`` literals, a byte-order mark, numbers past a double) is read by ``json``
    as before, so every body parses as it did."""
    if "json" in headers.get("content-type", ""):
        try:
            return msgspec.json.decode(body)
        except msgspec.MsgspecError:
            pass
        try:
            return json.loads(body)
        except ValueError:
            logger.warning("%s answered invalid JSON; keeping the text", url)
    return body.decode("utf-8", errors="replace")


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds of a ``Retry-After`` header (delta-seconds or an HTTP date; None when absent or invalid)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            logger.warning("ignoring an invalid Retry-After header %r", value[:60])
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


@dataclass(frozen=True)
class Answer:
    """A server's answer: status, decoded payload, and ``Retry-After`` in seconds when it sent one."""

    status: int
    payload: Any
    retry_after_s: float | None = None


#: paths of admin calls: SGLang's ``ADMIN_OPTIONAL`` endpoints (the embedded server's
#: ``server/auth.py`` guards the same ones) and vLLM's dev-mode control and weight endpoints.
ADMIN_PATHS: frozenset[str] = EMBEDDED_ADMIN_PATHS | frozenset(
    {
        # vLLM (its --api-key guards only /v1 routes, so these go unguarded there)
        "/pause",
        "/resume",
        "/start_weight_update",
        "/update_weights",
        "/init_weight_transfer_engine",
        "/finish_weight_update",
    }
)

KeyKind = Literal["api", "admin"]


def choose_key(path: str, api_key: str | None, admin_api_key: str | None) -> tuple[KeyKind | None, str | None]:
    """Which key a call to ``path`` carries: ``("admin", key)`` for an admin call when an admin key
    is set, else ``("api", key)`` when an API key is set, else ``(None, None)``."""
    if path in ADMIN_PATHS and admin_api_key:
        return "admin", admin_api_key
    if api_key:
        return "api", api_key
    return None, None


def refusal_message(path: str, sent: KeyKind | None) -> str:
    """What a 401/403 answer to a call to ``path`` means, given which key was sent (never the key
    itself). The caller's error already names the status, the server and the call."""
    admin = path in ADMIN_PATHS
    if sent is None:
        if admin:
            return (
                "no key was sent; the server requires its admin API key (ClientConfig.admin_api_key, from "
                "rollout.server.admin_api_key_env), or its API key when it has no admin key"
            )
        return "no key was sent; the server requires an API key (ClientConfig.api_key, from rollout.server.api_key_env)"
    if sent == "admin":
        return (
            "the server refused the admin API key (ClientConfig.admin_api_key, from "
            "rollout.server.admin_api_key_env): it is not the server's --admin-api-key"
        )
    if admin:
        return (
            f"{path} is an admin endpoint and the server refused the API key: it needs its admin key "
            "(set ClientConfig.admin_api_key via rollout.server.admin_api_key_env), or the API key is wrong"
        )
    return (
        "the server refused the API key (ClientConfig.api_key, from "
        "rollout.server.api_key_env): it is not the server's --api-key"
    )


def may_have_reached_server(exc: InferenceConnectionError) -> bool:
    """Whether the call that failed with ``exc`` (raised by :meth:`HttpTransport.send`) may be
    running on the server: False only when the connection was never opened."""
    return not never_sent(exc.__cause__)


class HttpTransport:
    """Sends calls to servers; ``transport_factory`` swaps the network for tests (httpx MockTransport)."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = 10.0,
        max_connections: int = 64,
        transport_factory: Callable[[], httpx.AsyncBaseTransport] | None = None,
        api_key: str | None = None,
        admin_api_key: str | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        # secrets: private, never logged (the class keeps object's repr)
        self._api_key = api_key
        self._admin_api_key = admin_api_key
        self._factory = transport_factory
        self._backends: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, HttpBackend] = weakref.WeakKeyDictionary()

    @property
    def n_pools(self) -> int:
        """Connection pools a loop uses: one aiohttp session, or the sharded httpx pools."""
        return 1 if self._factory is None else math.ceil(self._max_connections / POOL_CONNECTIONS)

    def backend(self) -> HttpBackend:
        """The running loop's connections (made on first use). Those of loops closed since are dropped."""
        loop = asyncio.get_running_loop()
        backend = self._backends.get(loop)
        if backend is None:
            for other in [other for other in self._backends if other.is_closed()]:
                self._backends.pop(other).forget()
            if self._factory is None:
                backend = AiohttpBackend(self._max_connections)
            else:
                backend = HttpxBackend(self._max_connections, self._factory)
            self._backends[loop] = backend
        return backend

    async def send(self, address: str, call: HttpCall, timeout_s: float) -> tuple[int, Any]:
        """Execute ``call`` on the server at ``address`` (a base URL); returns ``(status, payload)``."""
        answer = await self.exchange(address, call, timeout_s)
        return answer.status, answer.payload

    async def exchange(self, address: str, call: HttpCall, timeout_s: float) -> Answer:
        """:meth:`send`, with the ``Retry-After`` of the answer. Raises InferenceTimeoutError past
        ``timeout_s`` (the whole call) and InferenceConnectionError when the connection fails."""
        sent, key = choose_key(call.path, self._api_key, self._admin_api_key)
        headers = {"Authorization": f"Bearer {key}"} if key is not None else None
        url = address + call.path
        status, reply_headers, body = await self.backend().request(
            Request(
                call.method, url, call.json, call.params, headers, timeout_s, min(self._connect_timeout_s, timeout_s)
            )
        )
        if status in (401, 403):
            # the caller turns the status into its error; this says which key to fix
            return Answer(status, refusal_message(call.path, sent))
        return Answer(status, decode_reply(url, reply_headers, body), retry_after_s(reply_headers.get("retry-after")))

    async def aclose(self) -> None:
        """Close the connections of the running event loop."""
        backend = self._backends.pop(asyncio.get_running_loop(), None)
        if backend is not None:
            await backend.aclose()
