"""``HttpTransport`` over httpx (a transport factory given: the tests' in-process fakes) spreads calls
over sharded connection pools: each pool holds at most ``POOL_CONNECTIONS`` connections, calls take
the pools in turn, every pool reaches the server, and ``aclose`` closes them all. Over aiohttp (the
default) every loop's session shares the one TLS context."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from areal_tasks.inference.client.protocol import HttpCall
from areal_tasks.inference.client.transport import POOL_CONNECTIONS, HttpTransport


def _transport(max_connections: int, seen: list[int]) -> HttpTransport:
    made = []

    def factory() -> httpx.AsyncBaseTransport:
        index = len(made)
        made.append(index)

        def handler(request: httpx.Request) -> httpx.Response:
            seen.append(index)
            return httpx.Response(200, json={"pool": index})

        return httpx.MockTransport(handler)

    return HttpTransport(max_connections=max_connections, transport_factory=factory)


@pytest.mark.parametrize("max_connections,pools", [(1, 1), (POOL_CONNECTIONS, 1), (POOL_CONNECTIONS + 1, 2), (130, 9)])
def test_calls_take_the_pools_in_turn(max_connections, pools):
    seen: list[int] = []
    transport = _transport(max_connections, seen)

    async def run() -> list:
        answers = await asyncio.gather(
            *(transport.send("http://server", HttpCall("GET", "/health"), 5.0) for _ in range(3 * pools))
        )
        backend = transport.backend()
        clients = list(backend.clients)
        await transport.aclose()
        assert all(client.is_closed for client in clients)
        assert backend.limits.max_connections <= POOL_CONNECTIONS
        return answers

    answers = asyncio.run(run())
    assert all(status == 200 for status, _ in answers)
    assert sorted(set(seen)) == list(range(pools))
    assert all(seen.count(pool) == 3 for pool in range(pools))
    assert transport.n_pools == pools


def test_max_connections_must_be_positive():
    with pytest.raises(ValueError, match="max_connections must be >= 1"):
        HttpTransport(max_connections=0)


def test_sessions_share_one_tls_context(monkeypatch) -> None:
    """Building a verifying context loads the CA bundle (it held back the first of 256 concurrent
    calls when httpx built one per client): the sessions of every event loop share one."""
    import ssl

    from areal_tasks.inference.client.http_backends import AiohttpBackend

    built: list[ssl.SSLContext] = []
    real = ssl.create_default_context

    def counting(*args, **kwargs) -> ssl.SSLContext:
        built.append(real(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(ssl, "create_default_context", counting)
    transport = HttpTransport(max_connections=8 * POOL_CONNECTIONS)
    assert transport.n_pools == 1

    async def run() -> None:
        assert isinstance(transport.backend(), AiohttpBackend)
        assert transport.backend() is transport.backend()
        await transport.aclose()

    for _ in range(3):
        asyncio.run(run())
    assert len(built) <= 1  # the shared context (none when an earlier test built it already)
