"""Leaving the collective weight-update group: the adapters' call, the client forgetting the group,
and the executor's passthrough (fake SGLang servers behind an httpx MockTransport).

SGLang and the embedded server leave with ``/destroy_weights_update_group {group_name}``; vLLM has
no such endpoint, so its adapter has no call and the client only forgets the group. After a
teardown the next collective update of the same name joins again.
"""

from __future__ import annotations

import asyncio

import pytest
from fake_sglang import FakeCluster, make_engine

from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import InferenceControlError
from areal_tasks.inference.client import HttpCall, make_adapter

SPECS = [ParamSpec("a", "float32", (4, 4)), ParamSpec("b", "bfloat16", (8,))]


def _meta(version: int, group: str = "wg", port: int = 29600, servers: int = 2) -> WeightUpdateMeta:
    return WeightUpdateMeta.collective(version, "127.0.0.1", port, world_size=1 + servers, group_name=group)


def _paths(server) -> list[str]:
    return [p for p, _ in server.calls]


@pytest.mark.parametrize("backend", ["sglang", "embedded"])
def test_sglang_protocol_leaves_with_destroy_weights_update_group(backend: str) -> None:
    assert make_adapter(backend).destroy_weight_group("wg") == HttpCall(
        "POST", "/destroy_weights_update_group", json={"group_name": "wg"}
    )


def test_vllm_has_no_leave_call() -> None:
    assert make_adapter("vllm").destroy_weight_group("wg") is None


def test_destroy_makes_every_server_leave_then_a_new_update_joins_again() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        buckets = plan_weight_buckets(SPECS, bucket_bytes=1 << 20)
        async with make_engine(cluster) as engine:
            assert await engine.destroy_weight_groups() == []  # nothing joined: no call
            await engine.update_weights(_meta(1), buckets)
            assert engine.weight_groups == ["wg"] and all(s.groups == {"wg"} for s in cluster.servers)
            assert await engine.destroy_weight_groups() == ["wg"]
            assert engine.weight_groups == [] and all(s.groups == set() for s in cluster.servers)
            await engine.update_weights(_meta(2, port=29601), buckets)  # a new group, same name
            assert all(s.groups == {"wg"} for s in cluster.servers)
            assert await engine.destroy_weight_groups("other") == []
            assert await engine.destroy_weight_groups("wg") == ["wg"]
        for server in cluster.servers:
            paths = _paths(server)
            assert paths.count("/init_weights_update_group") == 2
            assert paths.count("/destroy_weights_update_group") == 2
            assert paths[-1] == "/destroy_weights_update_group" and server.groups == set()

    asyncio.run(scenario())


def test_a_server_that_fails_to_leave_is_reported_and_the_group_still_forgotten() -> None:
    async def scenario() -> None:
        cluster = FakeCluster(2)
        async with make_engine(cluster) as engine:
            await engine.update_weights(_meta(1), plan_weight_buckets(SPECS, bucket_bytes=1 << 20))
            cluster.servers[1].dead = True
            with pytest.raises(InferenceControlError, match=r"destroy_weights_update_group\(wg\) failed on 1 of 2"):
                await engine.destroy_weight_groups(timeout_s=5.0)
            assert engine.weight_groups == []
            assert cluster.servers[0].groups == set()

    asyncio.run(scenario())


def test_executor_passthrough_works_before_start_and_after_stop() -> None:
    from areal_tasks.rollout.executor import RolloutExecutor

    class NoWorkflow:
        async def arun_episode(self, engine, item):  # never admitted in this test
            raise AssertionError("no episode should run")

    cluster = FakeCluster(1)
    engine = make_engine(cluster)
    executor = RolloutExecutor(
        engine=engine,
        workflow=NoWorkflow(),
        dataset=[1, 2],
        batch_size=2,
        group_size=1,
        max_concurrent_rollouts=1,
        max_head_offpolicyness=0,
        max_failure_rate=0.5,
        seed=0,
    )
    buckets = plan_weight_buckets(SPECS, bucket_bytes=1 << 20)
    executor.pause()
    executor.update_weights(_meta(1, servers=1), buckets)
    assert executor.destroy_weight_groups() == ["wg"]  # before start: on the executor's loop
    executor.update_weights(_meta(2, port=29602, servers=1), buckets)
    executor.stop()
    assert executor.destroy_weight_groups() == ["wg"]  # after stop: on a fresh loop
    assert cluster.servers[0].groups == set()
    assert _paths(cluster.servers[0]).count("/destroy_weights_update_group") == 2
