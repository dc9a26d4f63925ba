"""Partial rollout: a pause mid-generation, a weight update, resubmission with the prefix, stitching
of tokens/logprobs/versions, affinity to the same server, and aborts that must not be resubmitted."""

from __future__ import annotations

import asyncio

import pytest
from fake_sglang import FakeCluster, logprob_of, make_engine

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import InferenceError, InferenceRequestError


async def until(predicate, limit: int = 10_000) -> None:
    for _ in range(limit):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def update_mid_generation(engine, cluster: FakeCluster, version: int) -> None:
    """Pause once every server holds its requests, update to ``version``, resume."""
    for server in cluster.servers:
        await until(server.reached.is_set)
    await engine.pause()
    await until(lambda: all(r.held for r in engine.inflight()))
    await engine.update_weights(WeightUpdateMeta.disk(f"/ckpt/v{version}", version))
    for server in cluster.servers:
        server.hold_after = None
    await engine.resume()


def test_weight_update_mid_generation_stitches_tokens_and_versions() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].hold_after = 3
        async with make_engine(cluster) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest([10, 20], SamplingParams(max_new_tokens=8))))
            await until(cluster.servers[0].reached.is_set)
            await engine.pause()
            await until(lambda: engine.inflight() and engine.inflight()[0].held)
            held = engine.inflight()[0]
            assert held.n_output_tokens == 3 and held.n_resubmits == 1
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v1", 1))
            cluster.servers[0].hold_after = None
            await engine.resume()
            resp = await task
        assert resp.output_ids == list(range(21, 29))  # the continuation picks up exactly where it stopped
        assert resp.output_versions == [0, 0, 0, 1, 1, 1, 1, 1]
        assert resp.output_logprobs == [logprob_of("default")] * 3 + [logprob_of("1")] * 5
        assert resp.stop_reason == "length" and resp.n_resubmits == 1
        first, second = cluster.servers[0].generate_calls()
        assert second["input_ids"] == [10, 20, 21, 22, 23]
        assert second["sampling_params"]["max_new_tokens"] == 5
        assert (first["rid"], second["rid"]) == (f"{resp.rid}-0000", f"{resp.rid}-0001")

    asyncio.run(scenario())


def test_many_requests_over_two_servers_lose_nothing() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        for server in cluster.servers:
            server.hold_after = 2
        async with make_engine(cluster) as engine:
            reqs = [ModelRequest([100 * i], SamplingParams(max_new_tokens=6)) for i in range(1, 7)]
            tasks = [asyncio.create_task(engine.agenerate(r)) for r in reqs]
            await until(lambda: sum(s.running for s in cluster.servers) == 6)
            await update_mid_generation(engine, cluster, version=4)
            responses = await asyncio.gather(*tasks)
        for req, resp in zip(reqs, responses):
            assert resp.output_ids == [req.input_ids[0] + k for k in range(1, 7)]
            assert resp.output_versions == [0, 0, 4, 4, 4, 4]
        assert engine.get_version() == 4

    asyncio.run(scenario())


def test_resubmission_returns_to_the_same_server() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].hold_after = 1
        async with make_engine(cluster) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=4))))
            await until(cluster.servers[0].reached.is_set)
            await engine.pause()
            await until(lambda: engine.inflight()[0].held)
            cluster.servers[0].hold_after = None
            await engine.resume()
            resp = await task
        # least-loaded alone would pick server 1 (never assigned); affinity keeps server 0
        assert len(cluster.servers[0].generate_calls()) == 2 and cluster.servers[1].generate_calls() == []
        assert resp.server == cluster.addresses[0] and resp.n_resubmits == 1

    asyncio.run(scenario())


def test_resubmission_moves_on_when_its_server_died() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[0].hold_after = 2
        async with make_engine(cluster) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=5))))
            await until(cluster.servers[0].reached.is_set)
            await engine.pause()
            await until(lambda: engine.inflight()[0].held)
            cluster.servers[0].dead = True
            engine.set_servers([cluster.addresses[1]])  # as after the fleet lost server 0
            await engine.resume()
            resp = await task
        assert resp.output_ids == [2, 3, 4, 5, 6] and resp.server == cluster.addresses[1]

    asyncio.run(scenario())


def test_versions_fall_back_to_the_client_when_the_server_reports_none() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].report_version = False
        cluster.servers[0].hold_after = 2
        async with make_engine(cluster, version=7) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=4))))
            await update_mid_generation(engine, cluster, version=8)
            resp = await task
        assert resp.output_versions == [7, 7, 8, 8]

    asyncio.run(scenario())


def test_a_request_in_transit_across_an_update_is_tagged_with_the_weights_that_ran_it() -> None:
    """Sent at version 0, it reaches the server only after the pause, waits there through the
    update and runs on version 1: a server that reports no versions must not get it tagged 0."""

    async def scenario() -> None:
        cluster = FakeCluster(1)
        server = cluster.servers[0]
        server.report_version, server.arrival = False, asyncio.Event()
        async with make_engine(cluster) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=3))))
            await until(lambda: len(server.generate_calls()) == 1)  # sent, still in transit
            await engine.pause()
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v1", 1))
            server.arrival.set()  # arrives at the paused server, which holds it
            await until(lambda: server.weight_version == "1" and not task.done())
            await engine.resume()
            resp = await task
        assert resp.output_logprobs == [logprob_of("1")] * 3  # generated by the new weights
        assert resp.output_versions == [1, 1, 1] and resp.n_resubmits == 0

    asyncio.run(scenario())


def test_without_server_versions_an_aborted_piece_keeps_the_old_version_across_pauses() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        server = cluster.servers[0]
        server.report_version, server.hold_after = False, 2
        async with make_engine(cluster, version=3) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=6))))
            await until(server.reached.is_set)
            await engine.pause()  # aborts after 2 tokens of version 3
            await until(lambda: engine.inflight()[0].held)
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v4", 4))
            await engine.resume()  # two more tokens of version 4, then held again
            await until(lambda: len(server.generate_calls()) == 2 and server.running == 1)
            await engine.pause()
            await until(lambda: engine.inflight()[0].held)
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v5", 5))
            server.hold_after = None
            await engine.resume()
            resp = await task
        assert resp.output_versions == [3, 3, 4, 4, 5, 5]
        assert resp.output_logprobs == [logprob_of("default")] * 2 + [logprob_of("4")] * 2 + [logprob_of("5")] * 2

    asyncio.run(scenario())


def test_request_submitted_while_paused_waits_and_gets_the_new_version() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        async with make_engine(cluster) as engine:
            await engine.pause()
            task = asyncio.create_task(engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=3))))
            await until(lambda: engine.inflight() and engine.inflight()[0].held)
            assert cluster.servers[0].generate_calls() == []
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v2", 2))
            await engine.resume()
            resp = await task
        assert resp.output_versions == [2, 2, 2] and resp.n_resubmits == 0

    asyncio.run(scenario())


def test_an_abort_carrying_an_error_is_not_resubmitted() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].abort_with = {
            "type": "abort",
            "message": "input is longer than the context",
            "status_code": 400,
            "err_type": "BadRequestError",
        }
        async with make_engine(cluster) as engine:
            with pytest.raises(InferenceRequestError, match="longer than the context"):
                await engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=3)))
        assert len(cluster.servers[0].generate_calls()) == 1

    asyncio.run(scenario())


def test_endless_aborts_stop_at_max_resubmits() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].abort_with = {"type": "abort", "message": "Aborted", "status_code": None}
        async with make_engine(cluster, max_resubmits=3) as engine:
            with pytest.raises(InferenceError, match="aborted 4 times"):
                await engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=3)))
        assert len(cluster.servers[0].generate_calls()) == 4

    asyncio.run(scenario())


def test_the_version_the_server_reports_wins() -> None:
    """A request the server held through an update (sent just before the pause reached it) ran on
    the new weights although the client tagged it with the old version: the server knows better."""

    async def scenario() -> None:
        cluster = FakeCluster(1)
        cluster.servers[0].weight_version = "6"
        async with make_engine(cluster, version=5) as engine:
            resp = await engine.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=3)))
        assert resp.output_versions == [6, 6, 6]

    asyncio.run(scenario())
