"""Worker functions of the GPU tests (run by ``tests/distributed/launch.py`` with NCCL)."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import torch
from engine_helpers import make_batch, token_mean_loss, token_weight
from workers_fsdp import build_engine, engine_config, full_params, local_share

logger = logging.getLogger(__name__)


def gpu_run(rank: int, world: int, out_dir: Path, model_dir: str, port: int | None = None) -> None:
    """fp32 gradients, bf16 forward and learning, DCP/HF save and an NCCL weight broadcast on GPUs."""
    from areal_tasks.api.weight_update import WeightUpdateMeta

    batch = make_batch(seed=0)
    fp32 = build_engine(model_dir, engine_config(2, dtype="float32"))
    stats32 = fp32.accumulate_gradients(local_share(fp32, batch), token_mean_loss, token_weight)
    grads32 = {n: g.cpu() for n, g in fp32.full_gradients().items()}
    fp32.destroy()

    engine = build_engine(model_dir, engine_config(2, lr=3e-3, grad_clip=1.0))  # dtype auto: bf16 on GPU
    forward = {k: v.float().cpu() for k, v in engine.forward_batch(batch, with_entropy=True).items()}
    losses = [engine.train_batch(local_share(engine, batch), token_mean_loss, token_weight)["loss"] for _ in range(8)]
    engine.save(str(out_dir / "dcp"), "dcp")
    engine.save(str(out_dir / "hf"), "hf")
    if port is not None:  # specs first: the receiver plans its buckets from them once the group is joined
        if rank == 0:
            specs = [dataclasses.asdict(s) for s in engine.weight_specs()]
            (out_dir / "specs.json").write_text(json.dumps(specs))
        from areal_tasks.weights.base import PublishContext
        from areal_tasks.weights.collective import CollectiveTransport

        transport = CollectiveTransport(engine, PublishContext(out_dir))
        transport.send(WeightUpdateMeta.collective(1, "127.0.0.1", port, 2, backend="nccl", timeout_s=120))
        transport.close()
    params = {n: p.cpu() for n, p in full_params(engine).items()}
    peak = torch.cuda.max_memory_allocated() / 2**20
    if rank == 0:
        torch.save(
            {
                "stats32": stats32,
                "grads32": grads32,
                "forward": forward,
                "losses": losses,
                "params": params,
                "peak_mib": peak,
            },
            out_dir / "result.pt",
        )
    engine.destroy()
