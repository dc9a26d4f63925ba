"""The client core against fake SGLang servers: balancing, affinity, retries, reroute, caps, timeouts."""

from __future__ import annotations

import asyncio

import pytest
from fake_sglang import FakeCluster, make_engine

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.errors import InferenceRequestError, InferenceRetriesExhaustedError


def request(n: int = 4, prompt: tuple[int, ...] = (10, 20)) -> ModelRequest:
    return ModelRequest(list(prompt), SamplingParams(max_new_tokens=n))


async def until(predicate, limit: int = 10_000) -> None:
    """Yield to the event loop until ``predicate()`` holds (bounded by iterations, not time)."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def test_generate_returns_tokens_logprobs_versions_and_timings() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        async with make_engine(cluster) as engine:
            resp = await engine.agenerate(request(5))
        assert resp.output_ids == [21, 22, 23, 24, 25]
        assert resp.output_logprobs == [-1.0] * 5
        assert resp.output_versions == [0] * 5
        assert resp.stop_reason == "length" and resp.n_resubmits == 0
        assert resp.server == cluster.addresses[0]
        assert 0 <= resp.ttft_s <= resp.latency_s
        body = cluster.servers[0].generate_calls()[0]
        assert body["input_ids"] == [10, 20] and body["return_logprob"] is True and body["stream"] is False
        assert body["rid"] == f"{resp.rid}-0000"

    asyncio.run(scenario())


def test_stop_token_gives_stop_reason() -> None:
    async def scenario() -> None:
        async with make_engine(FakeCluster(1)) as engine:
            resp = await engine.agenerate(ModelRequest([5], SamplingParams(max_new_tokens=10, stop_token_ids=(8,))))
        assert resp.output_ids == [6, 7, 8] and resp.stop_reason == "stop"

    asyncio.run(scenario())


def test_least_loaded_spreads_requests_evenly() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(3)
        for server in cluster.servers:
            server.hold_after = 1
        async with make_engine(cluster) as engine:
            tasks = [asyncio.create_task(engine.agenerate(request(2))) for _ in range(6)]
            await until(lambda: sum(s.running for s in cluster.servers) == 6)
            assert [s.running for s in cluster.servers] == [2, 2, 2]
            assert [s.in_flight for s in engine.server_states()] == [2, 2, 2]
            for server in cluster.servers:
                server.release.set()
            responses = await asyncio.gather(*tasks)
        assert all(r.output_len == 2 for r in responses)
        assert [s.in_flight for s in engine.server_states()] == [0, 0, 0]

    asyncio.run(scenario())


def test_least_loaded_avoids_the_busy_server() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].hold_after = 0
        async with make_engine(cluster) as engine:
            first = asyncio.create_task(engine.agenerate(request(1)))
            await until(lambda: cluster.servers[0].running == 1)
            second = await engine.agenerate(request(1))
            third = await engine.agenerate(request(1))
            assert second.server == third.server == cluster.addresses[1]
            cluster.servers[0].release.set()
            assert (await first).server == cluster.addresses[0]

    asyncio.run(scenario())


def test_concurrency_cap_limits_requests_in_flight() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        for server in cluster.servers:
            server.hold_after = 0
        async with make_engine(cluster, max_concurrent=3) as engine:
            tasks = [asyncio.create_task(engine.agenerate(request(1))) for _ in range(8)]
            await until(lambda: sum(s.running for s in cluster.servers) == 3)
            for _ in range(200):  # give the other five every chance to slip through
                await asyncio.sleep(0)
            assert sum(s.running for s in cluster.servers) == 3
            for server in cluster.servers:
                server.release.set()
            responses = await asyncio.gather(*tasks)
        assert len(responses) == 8
        assert cluster.max_total_running == 3

    asyncio.run(scenario())


def test_retries_with_exponential_backoff_then_succeeds() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].statuses = [503, 500]
        sleeps: list[float] = []
        async with make_engine(cluster, sleeps, max_retries=3) as engine:
            resp = await engine.agenerate(request(2))
        assert resp.output_ids == [21, 22]
        assert sleeps == [0.1, 0.2]
        rids = [b["rid"] for b in cluster.servers[0].generate_calls()]
        assert rids == [f"{resp.rid}-{k:04d}" for k in range(3)]  # every attempt has its own id

    asyncio.run(scenario())


def test_backoff_is_capped() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].statuses = [503] * 4
        sleeps: list[float] = []
        async with make_engine(cluster, sleeps, max_retries=4, max_backoff_s=0.25) as engine:
            await engine.agenerate(request(1))
        assert sleeps == [0.1, 0.2, 0.25, 0.25]

    asyncio.run(scenario())


def test_clear_error_once_retries_are_exhausted() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        for server in cluster.servers:
            server.statuses = [503] * 10
        sleeps: list[float] = []
        async with make_engine(cluster, sleeps, max_retries=2) as engine:
            req = request(1)
            with pytest.raises(InferenceRetriesExhaustedError) as info:
                await engine.agenerate(req)
        message = str(info.value)
        assert req.rid in message and "failed 3 times" in message and "HTTP 503" in message
        assert cluster.addresses[0] in message and cluster.addresses[1] in message
        assert sleeps == [0.1, 0.2]
        assert engine.inflight() == []

    asyncio.run(scenario())


def test_client_error_is_not_retried() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].statuses = [400]
        sleeps: list[float] = []
        async with make_engine(cluster, sleeps) as engine:
            with pytest.raises(InferenceRequestError, match="HTTP 400"):
                await engine.agenerate(request(1))
        assert sleeps == [] and cluster.servers[1].calls == []

    asyncio.run(scenario())


def test_reroutes_away_from_a_dead_server_and_keeps_avoiding_it() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].dead = True
        async with make_engine(cluster, dead_cooldown_s=3600) as engine:
            first = await engine.agenerate(request(2))
            second = await engine.agenerate(request(2))
            states = engine.server_states()
        assert first.server == second.server == cluster.addresses[1]
        assert states[0].failures == 1 and states[0].dead_until > 0
        assert len(cluster.servers[1].generate_calls()) == 2

    asyncio.run(scenario())


def test_a_dead_server_is_tried_again_after_its_cooldown() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].dead = True
        async with make_engine(cluster, dead_cooldown_s=1e-9) as engine:
            await engine.agenerate(request(1))
            cluster.servers[0].dead = False
            await until(lambda: engine._pool.is_alive(cluster.addresses[0]))
            resp = await engine.agenerate(request(1))
            states = engine.server_states()
        assert resp.server == cluster.addresses[0]
        assert states[0].failures == 0

    asyncio.run(scenario())


def test_timeout_is_retried_elsewhere() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].hang = True
        async with make_engine(cluster, request_timeout_s=0.05) as engine:
            resp = await engine.agenerate(request(2))
        assert resp.server == cluster.addresses[1] and resp.output_len == 2

    asyncio.run(scenario())


def test_timeouts_exhaust_retries_with_a_clear_error() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].hang = True
        async with make_engine(cluster, request_timeout_s=0.02, max_retries=1) as engine:
            with pytest.raises(InferenceRetriesExhaustedError, match="no answer within 0.0"):
                await engine.agenerate(request(2))
            assert engine.server_states()[0].in_flight == 0

    asyncio.run(scenario())


def test_all_servers_dead_gives_a_clear_error() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        for server in cluster.servers:
            server.dead = True
        async with make_engine(cluster) as engine:
            with pytest.raises(InferenceRetriesExhaustedError, match="ConnectError"):
                await engine.agenerate(request(1))

    asyncio.run(scenario())


def test_batch_helpers_keep_order() -> None:
    cluster = FakeCluster(2)
    engine = make_engine(cluster)
    reqs = [request(2, prompt=(p,)) for p in (1, 100, 500)]
    responses = engine.generate_batch(reqs)
    assert [r.rid for r in responses] == [r.rid for r in reqs]
    assert [r.output_ids for r in responses] == [[2, 3], [101, 102], [501, 502]]
    again = engine.generate_batch(reqs[:1])  # a second event loop works too
    assert again[0].output_ids == [2, 3]
