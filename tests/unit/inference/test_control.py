"""Control calls over the fleet: weight updates (disk, collective, shared), pause/resume, health, versions."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fake_sglang import FakeCluster, make_engine

from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import InferenceControlError

SPECS = [
    ParamSpec("embed", "float32", (8, 4)),
    ParamSpec("norm", "bfloat16", (4,)),
    ParamSpec("head", "float32", (4, 8)),
]


def calls(server, path):
    return [body for p, body in server.calls if p == path]


def test_disk_update_reaches_every_server_then_bumps_the_version() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(3)
        async with make_engine(cluster) as engine:
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v5", 5))
            assert engine.get_version() == 5
            assert await engine.server_versions() == dict.fromkeys(cluster.addresses, 5)
        for server in cluster.servers:
            assert [p for p, _ in server.calls if "weight" in p] == ["/update_weights_from_disk"]
            assert calls(server, "/update_weights_from_disk") == [
                {"model_path": "/ckpt/v5", "abort_all_requests": False, "weight_version": "5", "flush_cache": True}
            ]

    asyncio.run(scenario())


def test_failed_update_names_the_server_and_keeps_the_version() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        cluster.servers[1].fail_updates = True
        async with make_engine(cluster, version=2) as engine:
            with pytest.raises(InferenceControlError) as info:
                await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v3", 3))
            assert engine.get_version() == 2
        assert cluster.addresses[1] in str(info.value) and "1 of 2 servers" in str(info.value)
        assert "injected update failure" in str(info.value)

    asyncio.run(scenario())


def test_collective_update_joins_once_then_receives_each_bucket() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        buckets = plan_weight_buckets(SPECS, bucket_bytes=150)
        assert len(buckets) == 2
        async with make_engine(cluster, ranks_per_server=2) as engine:
            for version in (1, 2):
                meta = WeightUpdateMeta.collective(version, "127.0.0.1", 29511, world_size=5, group_name="wg")
                await engine.update_weights(meta, buckets)
                assert engine.get_version() == version
        for i, server in enumerate(cluster.servers):
            inits = calls(server, "/init_weights_update_group")
            assert len(inits) == 1 and inits[0]["rank_offset"] == 1 + 2 * i and inits[0]["world_size"] == 5
            received = calls(server, "/update_weights_from_distributed")
            assert [b["names"] for b in received] == [[p.name for p in b] for b in buckets] * 2
            assert [b["weight_version"] for b in received] == ["1", "1", "2", "2"]
            paths = [p for p, _ in server.calls if p != "/init_weights_update_group"]
            one_update = ["/begin_weight_update"] + ["/update_weights_from_distributed"] * 2 + ["/end_weight_update"]
            assert paths == one_update * 2 and not server.session

    asyncio.run(scenario())


def test_collective_update_checks_world_size_and_needs_buckets() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        async with make_engine(cluster) as engine:
            meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29512, world_size=4)
            with pytest.raises(InferenceControlError, match="world_size=4, but 1 trainer rank"):
                await engine.update_weights(meta, [SPECS])
            good = WeightUpdateMeta.collective(1, "127.0.0.1", 29512, world_size=3)
            with pytest.raises(InferenceControlError, match="bucket plan"):
                await engine.update_weights(good)
            assert engine.get_version() == 0
        assert all(server.calls == [] for server in cluster.servers)

    asyncio.run(scenario())


def test_shared_update_is_refused_before_any_call_where_it_cannot_work() -> None:
    """SGLang servers cannot read the trainer's shared buffers: the error says what to set instead;
    a shared update without buffers or layout names what is missing. No server is called."""
    buffer = {"kind": "file", "id": "a", "nbytes": 8, "path": "/dev/shm/a"}

    async def scenario() -> None:
        cluster = FakeCluster(2)
        async with make_engine(cluster) as engine:
            with pytest.raises(
                InferenceControlError,
                match="sglang servers cannot load weights from shared memory; "
                "set rollout.weight_update=disk or collective",
            ):
                await engine.update_weights(WeightUpdateMeta.shared(1, (buffer,)), [SPECS])
            with pytest.raises(InferenceControlError, match="names no buffer"):
                await engine.update_weights(WeightUpdateMeta.shared(1), [SPECS])
            with pytest.raises(InferenceControlError, match="exactly one bucket"):
                await engine.update_weights(WeightUpdateMeta.shared(1, (buffer,)), None)
            assert engine.get_version() == 0
        assert all(server.calls == [] for server in cluster.servers)

    asyncio.run(scenario())


def test_pause_and_resume_reach_every_server_and_report_dead_ones() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        async with make_engine(cluster) as engine:
            await engine.pause("in_place")
            await engine.resume()
            assert [calls(s, "/pause_generation") for s in cluster.servers] == [[{"mode": "in_place"}]] * 2
            assert all(len(calls(s, "/continue_generation")) == 1 for s in cluster.servers)
            cluster.servers[0].dead = True
            assert await engine.check_health() == {cluster.addresses[0]: False, cluster.addresses[1]: True}
            with pytest.raises(InferenceControlError, match="pause\\(abort\\) failed on 1 of 2 servers"):
                await engine.pause()

    asyncio.run(scenario())


@pytest.mark.parametrize(("mode", "flush"), [("abort", True), ("retract", False), ("in_place", False)])
def test_update_flushes_the_cache_only_when_no_paused_sequence_holds_kv(mode, flush) -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        buckets = plan_weight_buckets(SPECS, bucket_bytes=150)
        async with make_engine(cluster) as engine:
            await engine.pause(mode)
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v1", 1))
            meta = WeightUpdateMeta.collective(2, "127.0.0.1", 29512, world_size=3, group_name="wg")
            await engine.update_weights(meta, buckets)
            await engine.resume()
            await engine.update_weights(WeightUpdateMeta.disk("/ckpt/v3", 3))  # running again: flush
            assert engine.get_version() == 3
        for server in cluster.servers:
            assert [b["flush_cache"] for b in calls(server, "/update_weights_from_disk")] == [flush, True]
            assert [b["flush_cache"] for b in calls(server, "/update_weights_from_distributed")] == [flush] * len(
                buckets
            )

    asyncio.run(scenario())


def test_fake_server_refuses_a_flush_while_paused_sequences_hold_kv() -> None:
    """The fake is as strict as SGLang, so the test above would fail against a client that always flushes."""

    async def scenario() -> None:
        cluster = FakeCluster(1)
        body = {"model_path": "/ckpt/v1", "weight_version": "1", "flush_cache": True}
        async with httpx.AsyncClient(transport=cluster.transport(), base_url=cluster.addresses[0]) as http:
            await http.post("/pause_generation", json={"mode": "in_place"})
            refused = await http.post("/update_weights_from_disk", json=body)
            assert refused.status_code == 400 and "cache was not flushed" in refused.json()["message"]
            assert (
                await http.post("/update_weights_from_disk", json={**body, "flush_cache": False})
            ).status_code == 200
            await http.post("/continue_generation", json={})
            assert (await http.post("/update_weights_from_disk", json=body)).status_code == 200

    asyncio.run(scenario())
