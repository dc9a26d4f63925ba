"""A server whose queue is full answers 429 with ``Retry-After``: the client waits that long (or tries
another server at once) without spending one of ``max_retries``, for as long as the request timeout
lasts; a 429 without ``Retry-After``, or one that would outlast the timeout, counts as before."""

from __future__ import annotations

import asyncio

import pytest
from fake_sglang import FakeCluster, make_engine

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.errors import InferenceRetriesExhaustedError
from areal_tasks.inference.client.retry import MAX_RETRY_AFTER_S, overload_wait
from areal_tasks.inference.client.transport import retry_after_s


def request() -> ModelRequest:
    return ModelRequest([10, 20], SamplingParams(max_new_tokens=3))


def test_a_429_with_retry_after_is_waited_without_spending_a_retry() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].statuses = [429, 429, 429]
        cluster.servers[0].status_headers = {"Retry-After": "1"}
        sleeps: list[float] = []
        async with make_engine(cluster, sleeps, max_retries=0) as engine:
            resp = await engine.agenerate(request())
        assert resp.output_len == 3 and sleeps == [1.0, 1.0, 1.0]
        assert len(cluster.servers[0].generate_calls()) == 4

    asyncio.run(scenario())


def test_a_429_goes_to_another_server_at_once_when_one_is_left() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        full, free = cluster.servers
        full.statuses = [429]
        full.status_headers = {"Retry-After": "7"}
        sleeps: list[float] = []
        async with make_engine(cluster, sleeps, max_retries=0) as engine:
            resp = await engine.agenerate(request())
        assert resp.server == free.address and sleeps == []

    asyncio.run(scenario())


def test_a_429_without_retry_after_or_past_the_timeout_spends_retries() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].statuses = [429, 429]
        sleeps: list[float] = []
        async with make_engine(cluster, sleeps, max_retries=2) as engine:
            await engine.agenerate(request())
        assert sleeps == [0.1, 0.2]  # the ordinary backoff, two retries spent

        cluster = FakeCluster(1)
        cluster.servers[0].statuses = [429] * 5
        cluster.servers[0].status_headers = {"Retry-After": "5"}
        sleeps = []
        # the wait would outlast the request timeout: the 429s count, and the request fails
        async with make_engine(cluster, sleeps, max_retries=1, request_timeout_s=2.0) as engine:
            with pytest.raises(InferenceRetriesExhaustedError, match="HTTP 429"):
                await engine.agenerate(request())
        assert sleeps == [0.1] and len(cluster.servers[0].generate_calls()) == 2

    asyncio.run(scenario())


def test_retry_after_values() -> None:
    assert retry_after_s("3") == 3.0 and retry_after_s(" 0.5 ") == 0.5 and retry_after_s(None) is None
    assert retry_after_s("soon") is None and retry_after_s("-4") == 0.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert overload_wait(None, 100.0) is None and overload_wait(3.0, 2.0) is None
    assert overload_wait(600.0, 1e9) == MAX_RETRY_AFTER_S
