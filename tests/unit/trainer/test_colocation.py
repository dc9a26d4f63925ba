"""Colocation (``rollout|actor`` in the allocation): each train rank computes on the GPU it shares
with an inference server, in server order; nothing is shared when the allocation uses ``+`` or the
job runs on CPU, and a layout whose servers hold a different number of GPUs than the actor has
ranks is refused with both counts."""

from __future__ import annotations

import pytest

from areal_tasks.config import load_config
from areal_tasks.errors import ConfigError
from areal_tasks.trainer.rl import colocated_devices, rl_worker_spec


def _cfg(allocation: str, gpus: int, *extra: str):
    return load_config(None, [f"allocation={allocation}", f"cluster.gpus_per_node={gpus}", *extra])


def test_each_rank_shares_its_servers_gpu_in_server_order(tmp_path) -> None:
    cfg = _cfg("embedded[rollout]:d2|fsdp[actor]:d2", 2)
    shared = colocated_devices(cfg, [["1"], ["0"]])
    assert shared == [["1"], ["0"]]
    spec = rl_worker_spec(cfg, tmp_path / "c.yaml", ["a:1", "b:2"], shared)
    assert spec.replicas == 2 and spec.devices_per_worker == 1 and spec.shared_devices == [["1"], ["0"]]


def test_a_tensor_parallel_server_lends_one_gpu_to_each_rank() -> None:
    cfg = _cfg("sglang[rollout]:t2|fsdp[actor]:d2", 2, "rollout.backend=sglang")
    assert colocated_devices(cfg, [["2", "3"]]) == [["2"], ["3"]]


@pytest.mark.parametrize("allocation,gpus", [("embedded:d1+fsdp:d1", 2), ("embedded[rollout]:d1|fsdp[actor]:d1", 0)])
def test_nothing_is_shared_without_colocation_or_gpus(allocation: str, gpus: int) -> None:
    assert colocated_devices(_cfg(allocation, gpus), [["0"]]) is None


def test_a_count_mismatch_names_both_counts() -> None:
    cfg = _cfg("embedded[rollout]:d2|fsdp[actor]:d2", 2)
    with pytest.raises(
        ConfigError,
        match=r"the actor's 2 ranks share the inference servers' GPUs, but the servers "
        r"hold 1 \(0\)",
    ):
        colocated_devices(cfg, [["0"], []])
