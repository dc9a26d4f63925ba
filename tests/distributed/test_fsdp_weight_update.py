"""Collective weight update from a dp=2 engine: trainer rank 0 broadcasts the gathered full
weights in buckets to a receiver (this test process, standing in for an inference server) twice
over the same group; the receiver gets exactly the engine's weights of each version."""

from __future__ import annotations

import threading

import pytest
import torch

from launch import free_port, run_workers

pytestmark = pytest.mark.distributed


def test_collective_update_delivers_each_version(tiny_qwen2, tmp_path):
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.engine.weights.collective import join_weight_group, receive_weights

    port = free_port()
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", port, 2, timeout_s=120)
    received: list[dict] = []
    errors: list[BaseException] = []

    def receiver() -> None:
        try:
            group = join_weight_group(meta, 1)
            for version in (1, 2):
                received.append(dict(receive_weights(group, expected_version=version)))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            raise

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    run_workers("workers_fsdp:collective_run", 2, tmp_path, {"model_dir": str(tiny_qwen2), "port": port})
    thread.join(timeout=60)
    assert not errors, errors
    res = torch.load(tmp_path / "result.pt", weights_only=False)
    assert len(received) == 2
    for got, expected in zip(received, (res["first"], res["second"])):
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), name
    assert any(not torch.equal(res["first"][n], res["second"][n]) for n in res["first"])
