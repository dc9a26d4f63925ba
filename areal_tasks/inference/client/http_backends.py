"""The HTTP libraries under :class:`~.transport.HttpTransport`: one per event loop, each sending a
request and returning ``(status, headers, body)`` or raising the client's error types.

* :class:`AiohttpBackend`, the default: one ``aiohttp`` session per loop. Its C HTTP parser and
  connection pool cost about a tenth of httpx's host time per call: 0.12-0.13 ms of client CPU a
  ``/generate`` call against 1.0-1.4 ms through the sharded httpx pools (256 concurrent calls to the
  embedded server, 2 CPU cores; docs/benchmarks.md, "The HTTP client's cost"). At the rates RL sends
  (a thousand calls a second at 1,024 sequences in flight) httpx alone would fill a core of the
  rollout process.
* :class:`HttpxBackend`, when a caller gives an ``httpx`` transport factory (tests serve fake
  servers in process through ``httpx.MockTransport``): the sharded ``httpx.AsyncClient`` pools
  (httpcore's pool does work proportional to the requests it holds on every request it assigns, so
  one pool of 256 connections costs quadratic host time; ``POOL_CONNECTIONS`` a pool).

Both keep idle connections ``KEEPALIVE_EXPIRY_S`` at most (below uvicorn's 5 s: reusing a connection
the server is closing at that instant fails the call), trust no proxy settings from the environment,
and share one verifying TLS context. A failure carries the library's exception as ``__cause__``;
:func:`never_sent` says whether it struck before any byte of the request left.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx

from areal_tasks.errors import InferenceConnectionError, InferenceTimeoutError

__all__ = [
    "KEEPALIVE_EXPIRY_S",
    "POOL_CONNECTIONS",
    "AiohttpBackend",
    "HttpBackend",
    "HttpxBackend",
    "Reply",
    "never_sent",
    "query_params",
    "tls_context",
]

#: seconds an idle pooled connection is kept: below the servers' keep-alive timeouts (uvicorn's
#: default is 5 s; the embedded server keeps 75 s).
KEEPALIVE_EXPIRY_S = 2.0

#: connections per ``httpx.AsyncClient`` pool (see the module doc).
POOL_CONNECTIONS = 16

#: ``(status, headers with lower-case names, body)``.
Reply = tuple[int, Mapping[str, str], bytes]

#: library failures that happen before a request's bytes leave the client.
_NOT_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context (the certifi CA bundle) every pool and session shares: built once,
    not per client (loading the CA bundle held back the first of 256 concurrent calls)."""
    return httpx.create_ssl_context()


def never_sent(exc: BaseException | None) -> bool:
    """Whether the library failure ``exc`` struck before the request was sent (the connection was
    never opened, or no pooled connection came free)."""
    return isinstance(exc, _NOT_SENT)


def query_params(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    """Query values as text, as httpx writes them: ``true``/``false`` for booleans, ``""`` for None."""
    if params is None:
        return None
    out = {}
    for name, value in params.items():
        if isinstance(value, bool):
            out[name] = "true" if value else "false"
        else:
            out[name] = "" if value is None else str(value)
    return out


@dataclass(frozen=True)
class Request:
    """One HTTP call as a backend sends it."""

    method: str
    url: str
    json: Any
    params: Mapping[str, Any] | None
    headers: Mapping[str, str] | None
    #: the whole call's deadline, and the connection's (at most the whole call's).
    timeout_s: float
    connect_timeout_s: float


class HttpBackend(Protocol):
    """One event loop's connections to every server."""

    async def request(self, call: Request) -> Reply: ...

    async def aclose(self) -> None: ...

    def forget(self) -> None:
        """Drop the connections of a loop that is closed (nothing can be awaited on it any more)."""


def _failed(url: str, timeout_s: float, exc: BaseException) -> InferenceConnectionError:
    if isinstance(exc, (asyncio.TimeoutError, httpx.TimeoutException)):
        return InferenceTimeoutError(f"{url}: no answer within {timeout_s:.1f}s")
    return InferenceConnectionError(f"{url}: {type(exc).__name__}: {exc}")


class AiohttpBackend:
    """One ``aiohttp.ClientSession`` with a pool of ``max_connections`` (see the module doc)."""

    def __init__(self, max_connections: int) -> None:
        self._connector = aiohttp.TCPConnector(
            limit=max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_EXPIRY_S, ssl=tls_context()
        )
        self._session = aiohttp.ClientSession(
            connector=self._connector, trust_env=False, timeout=aiohttp.ClientTimeout(total=None)
        )

    async def request(self, call: Request) -> Reply:
        timeout = aiohttp.ClientTimeout(total=call.timeout_s, connect=min(call.connect_timeout_s, call.timeout_s))
        try:
            async with self._session.request(
                call.method,
                call.url,
                json=call.json,
                params=query_params(call.params),
                headers=call.headers,
                timeout=timeout,
            ) as response:
                body = await response.read()
                return response.status, {k.lower(): v for k, v in response.headers.items()}, body
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            raise _failed(call.url, call.timeout_s, exc) from exc

    async def aclose(self) -> None:
        await self._session.close()

    def forget(self) -> None:
        self._session.detach()  # the session counts as closed; its connector goes below
        self._connector._close()  # no await on a closed loop: mark closed, skip the transports

    def __del__(self) -> None:
        # a loop that ended without aclose (a thread's own loop): its session would log "Unclosed
        # client session" at garbage collection; nothing is left to close on that loop
        session = getattr(self, "_session", None)  # absent when __init__ failed
        if session is not None and not session.closed:
            self.forget()


class HttpxBackend:
    """``ceil(max_connections / POOL_CONNECTIONS)`` ``httpx.AsyncClient`` pools taken in turn, each
    over ``transport_factory()`` (see the module doc)."""

    def __init__(self, max_connections: int, transport_factory: Callable[[], httpx.AsyncBaseTransport]) -> None:
        self.n_pools = math.ceil(max_connections / POOL_CONNECTIONS)
        per_pool = math.ceil(max_connections / self.n_pools)
        self.limits = httpx.Limits(
            max_connections=per_pool, max_keepalive_connections=per_pool, keepalive_expiry=KEEPALIVE_EXPIRY_S
        )
        self._factory = transport_factory
        self.clients: list[httpx.AsyncClient] = []
        self._turn = itertools.count()

    def _client(self) -> httpx.AsyncClient:
        index = next(self._turn) % self.n_pools
        while len(self.clients) <= index:
            self.clients.append(self._new_client())
        if self.clients[index].is_closed:
            self.clients[index] = self._new_client()
        return self.clients[index]

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=self._factory(), limits=self.limits, timeout=None, trust_env=False, verify=tls_context()
        )

    async def request(self, call: Request) -> Reply:
        timeout = httpx.Timeout(call.timeout_s, connect=min(call.connect_timeout_s, call.timeout_s))
        try:
            async with asyncio.timeout(call.timeout_s):  # the total deadline, without a task per call
                response = await self._client().request(
                    call.method, call.url, json=call.json, params=call.params, headers=call.headers, timeout=timeout
                )
        except (asyncio.TimeoutError, httpx.TimeoutException, httpx.TransportError) as exc:
            raise _failed(call.url, call.timeout_s, exc) from exc
        return response.status_code, response.headers, response.content

    async def aclose(self) -> None:
        clients, self.clients = self.clients, []
        for client in clients:
            await client.aclose()

    def forget(self) -> None:
        self.clients = []
