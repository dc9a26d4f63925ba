"""The FSDP2 engine on GPUs with NCCL (dp = number of GPUs, at most 2): fp32 gradients match the
CPU reference, the bf16 mixed-precision forward is close to it, bf16 training lowers the loss on a
fixed batch, DCP/HF saving works from GPU shards, and with 2 GPUs the collective weight update
broadcasts over NCCL (SGLang's protocol) to a receiver on the second GPU that uses the embedded
server's receive code. Tolerances are looser than on CPU (GPU kernels sum in another order)."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from engine_helpers import make_batch, max_abs_diff, reference_grads, reference_logprobs
from launch import free_port, run_workers

pytestmark = pytest.mark.gpu


def test_fsdp_engine_on_gpus(tiny_qwen2, tmp_path, monkeypatch):
    from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.weights.base import WeightLoad
    from areal_tasks.weights.collective import CollectiveReceiver

    n_gpus = torch.cuda.device_count()
    world = min(2, n_gpus)
    port = free_port() if n_gpus >= 2 else None
    received: list[dict] = []
    errors: list[BaseException] = []

    def receiver() -> None:
        try:
            torch.cuda.set_device(1)
            meta = WeightUpdateMeta.collective(1, "127.0.0.1", port, 2, backend="nccl", timeout_s=120)
            server = CollectiveReceiver(torch.device("cuda", 1))
            server.join(meta.master_addr, port, 1, 2, meta.group_name, "nccl", meta.timeout_s)
            specs = [ParamSpec(**s) for s in json.loads((tmp_path / "specs.json").read_text())]
            update = {}
            for b in plan_weight_buckets(specs, meta.bucket_bytes):  # as the client plans them
                got = server.receive(WeightLoad.for_specs(b, group_name=meta.group_name))
                update.update({n: t.cpu() for n, t in got.items()})
            received.append(update)
            # leave the group as a server does, so the trainer's own teardown (a bounded destroy) completes
            server.leave(meta.group_name, timeout_s=120)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            raise

    thread = None
    if port is not None:  # the group is engine rank 0 (GPU 0) + this receiver (GPU 1)
        thread = threading.Thread(target=receiver, daemon=True)
        thread.start()
    here = str(Path(__file__).resolve().parent)  # workers_gpu is found by the worker processes here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    run_workers(
        "workers_gpu:gpu_run",
        world,
        tmp_path,
        {"model_dir": str(tiny_qwen2), "port": port},
        backend="nccl",
        timeout_s=400,
    )
    res = torch.load(tmp_path / "result.pt", weights_only=False)

    batch = make_batch(seed=0)
    loss, grads, model = reference_grads(tiny_qwen2, batch)
    assert res["stats32"]["loss"] == pytest.approx(loss, abs=1e-4)
    diff, name = max_abs_diff(res["grads32"], grads)
    assert diff < 1e-4, f"fp32 gradient of {name} differs by {diff} on GPU"
    with torch.no_grad():
        ref = reference_logprobs(model, batch)
    assert (res["forward"]["logprobs"] - ref).abs().max() < 0.1, "bf16 forward far from the fp32 reference"
    assert res["losses"][-1] < res["losses"][0] - 0.05, f"bf16 training did not lower the loss: {res['losses']}"
    assert (tmp_path / "dcp" / "train_state.json").is_file() and (tmp_path / "hf" / "config.json").is_file()
    if thread is not None:
        thread.join(timeout=120)
        assert not errors, errors
        for name_, tensor in res["params"].items():
            assert torch.equal(received[0][name_], tensor), name_
