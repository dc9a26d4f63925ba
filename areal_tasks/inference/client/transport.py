"""``HttpTransport``: executes an adapter's :class:`~.protocol.HttpCall` against one server.

One ``httpx.AsyncClient`` per running event loop (so blocking helpers that run their own loop
work), a total deadline per call, and transport failures turned into the client's error types:
:class:`~areal_tasks.errors.InferenceTimeoutError` and
:class:`~areal_tasks.errors.InferenceConnectionError`. HTTP error statuses are returned, not raised:
what they mean is for the core and the adapter to judge.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

import httpx

from areal_tasks.errors import InferenceConnectionError, InferenceTimeoutError
from areal_tasks.inference.client.protocol import HttpCall

logger = logging.getLogger(__name__)

__all__ = ["HttpTransport", "may_have_reached_server"]

#: seconds an idle pooled connection is kept: below the servers' keep-alive timeouts (uvicorn's
#: default is 5 s; the embedded server keeps 75 s).
KEEPALIVE_EXPIRY_S = 2.0


def _decode(response: httpx.Response) -> Any:
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except ValueError:
            logger.warning("%s answered invalid JSON; keeping the text", response.request.url)
    return response.text


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
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        # idle connections are dropped before servers drop them (uvicorn closes after 5 s by default):
        # reusing one the server is closing at that instant fails the request with a ReadError
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                    keepalive_expiry=KEEPALIVE_EXPIRY_S)  # fmt: skip
        self._factory = transport_factory
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            transport = self._factory() if self._factory is not None else None
            client = httpx.AsyncClient(transport=transport, limits=self._limits, timeout=None, trust_env=False)
            self._clients[loop] = client
        return client

    async def send(self, address: str, call: HttpCall, timeout_s: float) -> tuple[int, Any]:
        """Execute ``call`` on the server at ``address`` (a base URL); returns ``(status, payload)``."""
        timeout = httpx.Timeout(timeout_s, connect=min(self._connect_timeout_s, timeout_s))
        request = self._client().request(
            call.method, address + call.path, json=call.json, params=call.params, timeout=timeout
        )
        try:
            response = await asyncio.wait_for(request, timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException) as exc:
            raise InferenceTimeoutError(f"{address}{call.path}: no answer within {timeout_s:.1f}s") from exc
        except httpx.TransportError as exc:
            raise InferenceConnectionError(f"{address}{call.path}: {type(exc).__name__}: {exc}") from exc
        return response.status_code, _decode(response)

    async def aclose(self) -> None:
        """Close the connections of the running event loop."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
