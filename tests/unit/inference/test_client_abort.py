"""Abandoned attempts are aborted on their server: a timeout, a caller's cancellation, a retry
elsewhere each send exactly one ``/abort_request`` for the attempt's rid; answered attempts (5xx,
refused connections, a pause's partial output) send none; a failing abort never reaches the caller."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fake_sglang import FakeCluster, make_engine

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import InferenceError, InferenceRetriesExhaustedError
from areal_tasks.inference.client import make_adapter


def request(n: int = 4) -> ModelRequest:
    return ModelRequest([10, 20], SamplingParams(max_new_tokens=n))


async def until(predicate, limit: int = 10_000) -> None:
    """Yield to the event loop until ``predicate()`` holds (bounded by iterations, not time)."""
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


def test_adapters_name_their_abort_call() -> None:
    call = make_adapter("sglang").abort("r-0003")
    assert (call.method, call.path, call.json) == ("POST", "/abort_request", {"rid": "r-0003", "abort_all": False})
    assert make_adapter("embedded").abort("r-0003") == call
    with pytest.raises(InferenceError, match="non-empty"):
        make_adapter("sglang").abort("")  # SGLang would abort every request by prefix
    # vLLM aborts a request when its connection closes (with_cancellation): nothing to send
    assert make_adapter("vllm").abort("r-0003") is None


def test_a_timed_out_request_is_aborted_once() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].hang = True
        req = request()
        async with make_engine(cluster, request_timeout_s=0.05, max_retries=0) as engine:
            with pytest.raises(InferenceRetriesExhaustedError, match="no answer within"):
                await engine.agenerate(req)
        # leaving the engine waited for the background abort
        assert cluster.servers[0].aborts == [f"{req.rid}-0000"]

    asyncio.run(scenario())


def test_a_timeout_retried_elsewhere_aborts_the_first_attempt_only() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].hang = True
        async with make_engine(cluster, request_timeout_s=0.05) as engine:
            resp = await engine.agenerate(request(2))
        assert resp.server == cluster.addresses[1] and resp.output_ids == [21, 22]
        assert cluster.servers[0].aborts == [f"{resp.rid}-0000"]
        assert cluster.servers[1].aborts == []

    asyncio.run(scenario())


def test_a_cancelled_request_is_aborted_once() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        server = cluster.servers[0]
        server.hold_after = 1
        req = request()
        async with make_engine(cluster) as engine:
            task = asyncio.create_task(engine.agenerate(req))
            await until(server.reached.is_set)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert engine.inflight() == [] and engine.server_states()[0].in_flight == 0
        assert server.aborts == [f"{req.rid}-0000"]
        assert server.running == 0

    asyncio.run(scenario())


def test_cancelled_before_sending_sends_no_abort() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        async with make_engine(cluster) as engine:
            await engine.pause()
            task = asyncio.create_task(engine.agenerate(request()))
            await until(lambda: bool(engine.inflight()) and engine.inflight()[0].held)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert cluster.servers[0].aborts == [] and cluster.servers[0].generate_calls() == []

    asyncio.run(scenario())


def test_answered_attempts_send_no_abort() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].dead = True  # refused: the request never reached it
        cluster.servers[1].statuses = [503]  # answered: the server is done with it
        async with make_engine(cluster, dead_cooldown_s=3600) as engine:
            resp = await engine.agenerate(request(2))
        assert resp.output_ids == [21, 22]
        assert cluster.servers[0].aborts == [] and cluster.servers[1].aborts == []

    asyncio.run(scenario())


def test_a_pause_abort_is_resubmitted_not_aborted() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        server = cluster.servers[0]
        server.hold_after = 2
        async with make_engine(cluster) as engine:
            task = asyncio.create_task(engine.agenerate(request(5)))
            await until(server.reached.is_set)
            await engine.pause()
            await until(lambda: bool(engine.inflight()) and engine.inflight()[0].held)
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v1", 1))
            server.hold_after = None
            await engine.resume()
            resp = await task
        assert resp.output_ids == [21, 22, 23, 24, 25] and resp.n_resubmits == 1
        assert server.aborts == []

    asyncio.run(scenario())


def test_a_failing_abort_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        server = cluster.servers[0]
        server.hold_after = 0
        async with make_engine(cluster) as engine:
            task = asyncio.create_task(engine.agenerate(request()))
            await until(server.reached.is_set)
            server.dead = True  # the abort's connection is refused
            task.cancel()
            with pytest.raises(asyncio.CancelledError):  # the caller sees its own cancellation only
                await task
        assert server.aborts == []

    with caplog.at_level(logging.WARNING, logger="areal_tasks.inference.client.core"):
        asyncio.run(scenario())
    assert any("abort on" in r.getMessage() and "may still run there" in r.getMessage() for r in caplog.records)
