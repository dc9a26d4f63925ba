"""Weight updates from a dp=2 engine.

Shared memory: the ranks gather, rank 0 packs into its buffer (one on CPU), and what a server
reads from it is exactly the engine's weights of each version, staged or not.

Collective: a collective weight update from a dp=2 engine, SGLang's protocol end to end: trainer rank 0 joins
the group and broadcasts one flattened bucket per planned bucket, twice over the same group; the
receiver (this test process, standing in for an inference server) joins and receives with the
collective transport's receiving side (the embedded server's and the vLLM plugin's), planning the
buckets from the engine's weight specs as the client does, and gets exactly the engine's weights
of each version."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from launch import free_port, run_workers

pytestmark = pytest.mark.distributed

BUCKET_BYTES = 64 * 1024


def test_collective_update_delivers_each_version(tiny_qwen2, tmp_path):
    from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
    from areal_tasks.weights.base import WeightLoad
    from areal_tasks.weights.collective import CollectiveReceiver

    port, group_name = free_port(), "engine_dp2_update"
    received: list[dict] = []
    n_buckets: list[int] = []
    errors: list[BaseException] = []

    def server() -> None:
        try:
            receiver = CollectiveReceiver(torch.device("cpu"))
            receiver.join("127.0.0.1", port, 1, 2, group_name, "gloo", 120)
            specs = [ParamSpec(**s) for s in json.loads((tmp_path / "specs.json").read_text())]
            buckets = plan_weight_buckets(specs, BUCKET_BYTES)
            n_buckets.append(len(buckets))
            for _ in (1, 2):
                update: dict[str, torch.Tensor] = {}
                for b in buckets:
                    update.update(receiver.receive(WeightLoad.for_specs(b, group_name=group_name)))
                received.append(update)
            receiver.close()
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            raise

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    run_workers(
        "workers_fsdp:collective_run",
        2,
        tmp_path,
        {"model_dir": str(tiny_qwen2), "port": port, "group": group_name, "bucket_bytes": BUCKET_BYTES},
    )
    thread.join(timeout=60)
    assert not thread.is_alive(), "the receiver did not finish"
    assert not errors, errors
    assert n_buckets[0] > 1
    res = torch.load(tmp_path / "result.pt", weights_only=False)
    assert len(received) == 2
    for got, expected in zip(received, (res["first"], res["second"])):
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    assert any(not torch.equal(res["first"][n], res["second"][n]) for n in res["first"])


def test_shared_update_packs_each_version_into_rank0s_buffer(tiny_qwen2, tmp_path):
    run_workers("workers_fsdp:shared_run", 2, tmp_path, {"model_dir": str(tiny_qwen2)})
    res = torch.load(tmp_path / "result.pt", weights_only=False)
    (description,) = res["descriptions"]  # on CPU only rank 0 holds a buffer
    assert description["kind"] == "file" and res["gone"]
    for got, expected in ((res["first"], res["expected_first"]), (res["second"], res["expected_second"])):
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    assert any(not torch.equal(res["first"][n], res["second"][n]) for n in res["first"])
