"""``HttpTransport``: executes an adapter's :class:`~.protocol.HttpCall` against one server.

``httpx.AsyncClient`` pools per running event loop (so blocking helpers that run their own loop
work), a total deadline per call, and transport failures turned into the client's error types:
:class:`~areal_tasks.errors.InferenceTimeoutError` and
:class:`~areal_tasks.errors.InferenceConnectionError`. HTTP error statuses are returned, not raised:
what they mean is for the core and the adapter to judge.

Connection pools are sharded: httpcore's pool does work proportional to the requests it holds on
every request it assigns, so one pool of 256 connections costs quadratic host time: with 256
concurrent ``/generate`` calls to the embedded server on 2 CPU cores, 16 pools of 16 connections
carried several times the tokens of one pool (docs/benchmarks_history.md, "Inference throughput
(H200)", 2026-11-30). So the transport keeps ``ceil(max_connections / POOL_CONNECTIONS)`` clients
per loop and hands calls to them in turn. The pools share one TLS context (:func:`tls_context`):
left to itself, httpx builds a verifying context, CA bundle included, for every client, which
held back the first of 256 concurrent calls (the same page, third session).

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
import functools
import itertools
import logging
import math
import ssl
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from areal_tasks.errors import InferenceConnectionError, InferenceTimeoutError
from areal_tasks.inference.admin_paths import EMBEDDED_ADMIN_PATHS
from areal_tasks.inference.client.protocol import HttpCall

logger = logging.getLogger(__name__)

__all__ = [
    "ADMIN_PATHS",
    "Answer",
    "HttpTransport",
    "choose_key",
    "may_have_reached_server",
    "refusal_message",
    "retry_after_s",
]

#: seconds an idle pooled connection is kept: below the servers' keep-alive timeouts (uvicorn's
#: default is 5 s; the embedded server keeps 75 s).
KEEPALIVE_EXPIRY_S = 2.0

#: connections per ``httpx.AsyncClient`` pool (see the module doc).
POOL_CONNECTIONS = 16


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context (httpx's default: the certifi CA bundle) every pool shares."""
    return httpx.create_ssl_context()


def _decode(response: httpx.Response) -> Any:
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except ValueError:
            logger.warning("%s answered invalid JSON; keeping the text", response.request.url)
    return response.text


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


#: httpx failures that happen before a request's bytes leave the client.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def may_have_reached_server(exc: InferenceConnectionError) -> bool:
    """Whether the call that failed with ``exc`` (raised by :meth:`HttpTransport.send`) may be
    running on the server: False only when the connection was never opened."""
    return not isinstance(exc.__cause__, _NOT_SENT)


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
        self._connect_timeout_s = connect_timeout_s
        # secrets: private, never logged (the class keeps object's repr)
        self._api_key = api_key
        self._admin_api_key = admin_api_key
        # idle connections are dropped before servers drop them (uvicorn closes after 5 s by default):
        # reusing one the server is closing at that instant fails the request with a ReadError
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._pools = math.ceil(max_connections / POOL_CONNECTIONS)
        per_pool = math.ceil(max_connections / self._pools)
        self._limits = httpx.Limits(
            max_connections=per_pool, max_keepalive_connections=per_pool, keepalive_expiry=KEEPALIVE_EXPIRY_S
        )
        self._factory = transport_factory
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[httpx.AsyncClient]] = (
            weakref.WeakKeyDictionary()
        )
        self._turn = itertools.count()

    def _client(self) -> httpx.AsyncClient:
        """The next of the running loop's pools, in turn (created on first use, re-created if closed)."""
        loop = asyncio.get_running_loop()
        clients = self._clients.setdefault(loop, [])
        index = next(self._turn) % self._pools
        while len(clients) <= index:
            clients.append(self._new_client())
        if clients[index].is_closed:
            clients[index] = self._new_client()
        return clients[index]

    def _new_client(self) -> httpx.AsyncClient:
        transport = self._factory() if self._factory is not None else None
        return httpx.AsyncClient(
            transport=transport, limits=self._limits, timeout=None, trust_env=False, verify=tls_context()
        )

    async def send(self, address: str, call: HttpCall, timeout_s: float) -> tuple[int, Any]:
        """Execute ``call`` on the server at ``address`` (a base URL); returns ``(status, payload)``."""
        answer = await self.exchange(address, call, timeout_s)
        return answer.status, answer.payload

    async def exchange(self, address: str, call: HttpCall, timeout_s: float) -> Answer:
        """:meth:`send`, with the ``Retry-After`` of the answer."""
        timeout = httpx.Timeout(timeout_s, connect=min(self._connect_timeout_s, timeout_s))
        sent, key = choose_key(call.path, self._api_key, self._admin_api_key)
        headers = {"Authorization": f"Bearer {key}"} if key is not None else None
        client = self._client()
        try:
            async with asyncio.timeout(timeout_s):  # the total deadline, without a task per call
                response = await client.request(
                    call.method,
                    address + call.path,
                    json=call.json,
                    params=call.params,
                    headers=headers,
                    timeout=timeout,
                )
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            raise InferenceTimeoutError(f"{address}{call.path}: no answer within {timeout_s:.1f}s") from exc
        except httpx.TransportError as exc:
            raise InferenceConnectionError(f"{address}{call.path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code in (401, 403):
            # the caller turns the status into its error; this says which key to fix
            return Answer(response.status_code, refusal_message(call.path, sent))
        return Answer(response.status_code, _decode(response), retry_after_s(response.headers.get("retry-after")))

    async def aclose(self) -> None:
        """Close the connections of the running event loop."""
        for client in self._clients.pop(asyncio.get_running_loop(), []):
            await client.aclose()
