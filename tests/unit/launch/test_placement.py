"""The placement plan: where every server and actor rank runs, on CPU and on GPU nodes."""

from __future__ import annotations

import pytest

from areal_tasks.config.cluster import ClusterConfig
from areal_tasks.errors import ConfigError
from areal_tasks.launch.placement import plan_placement


def cluster(nodes: int, gpus: int = 0) -> ClusterConfig:
    return ClusterConfig(scheduler="ray", nodes=nodes, gpus_per_node=gpus)


def test_one_node_puts_everything_on_node_0() -> None:
    plan = plan_placement("embedded:d2+fsdp:d2", ClusterConfig())
    assert plan.servers == (0, 0) and plan.actor == (0, 0)


def test_cpu_demo_on_two_nodes_splits_the_train_ranks() -> None:
    plan = plan_placement("embedded:d1+fsdp:d2", cluster(2))
    assert plan.servers == (0,) and plan.actor == (0, 1)


def test_cpu_blocks_and_round_robin() -> None:
    plan = plan_placement("embedded:d3+fsdp:d2t2", cluster(2))
    assert plan.servers == (0, 1, 0)
    assert plan.actor == (0, 0, 1, 1)  # neighbours (a tp pair) share a node
    uneven = plan_placement("embedded:d1+fsdp:d3", cluster(2))
    assert uneven.actor == (0, 0, 1)


def test_gpus_fill_nodes_servers_first() -> None:
    plan = plan_placement("sglang:d2t2+fsdp:d4", cluster(2, gpus=4))
    assert plan.servers == (0, 0) and plan.actor == (1, 1, 1, 1)
    mixed = plan_placement("sglang:d1t2+fsdp:d4", cluster(2, gpus=4))
    assert mixed.servers == (0,) and mixed.actor == (0, 0, 1, 1)


def test_a_server_larger_than_a_node_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"needs 8 GPUs .* cluster.gpus_per_node is 4"):
        plan_placement("sglang:d1t8+fsdp:d4", cluster(3, gpus=4))


def test_too_few_gpus_is_refused() -> None:
    with pytest.raises(ConfigError, match="actor rank 4 finds no free GPU"):
        plan_placement("sglang:d1t4+fsdp:d8", cluster(2, gpus=4))


def test_colocated_actor_follows_its_servers() -> None:
    plan = plan_placement("sglang[rollout]:d2t2|fsdp[actor]:d4", cluster(2, gpus=2))
    assert plan.servers == (0, 1) and plan.actor == (0, 0, 1, 1)


def test_names_in_the_summary() -> None:
    plan = plan_placement("embedded:d1+fsdp:d2", cluster(2))
    assert plan.to_dict(["a", "b"]) == {"servers": ["a"], "actor": ["a", "b"]}
