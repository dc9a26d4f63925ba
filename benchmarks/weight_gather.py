"""Gathering a sharded model's full weights for a weight update: per tensor against per FSDP unit.

    python benchmarks/weight_gather.py [--layers 24] [--hidden 64] [--repeats 5]

Two ranks (gloo on CPU; NCCL when two GPUs are visible) shard a tiny Qwen2 of ``--layers`` decoder
blocks with FSDP2 (one unit per block plus the root), then time
``iter_full_tensors(model, device)`` (one ``DTensor.full_tensor`` all-gather per tensor, what
checkpoints use) against ``iter_full_tensors(..., in_param_dtype=True)`` (one
``FSDPModule.unshard`` per unit, what a weight update uses), medians of ``--repeats`` after one
warm-up, and checks that both give identical tensors. Prints a table and writes
``benchmarks/results/weight_gather.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "weight_gather.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(ROOT))
    from areal_tasks.engine.fsdp.export import iter_full_tensors

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.device_count() >= world
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    config = Qwen2Config(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        intermediate_size=2 * args.hidden,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def timed(in_param_dtype: bool) -> tuple[list[float], dict]:
        times, tensors = [], {}
        for _ in range(args.repeats + 1):
            dist.barrier()
            started = time.perf_counter()
            tensors = dict(iter_full_tensors(model, device, in_param_dtype=in_param_dtype))
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        return times[1:], tensors

    per_tensor, reference = timed(False)
    per_unit, unsharded = timed(True)
    if rank == 0:
        identical = reference.keys() == unsharded.keys() and all(
            torch.equal(reference[k], unsharded[k]) for k in reference
        )
        Path(out).write_text(
            json.dumps(
                {
                    "tensors": len(reference),
                    "identical": identical,
                    "backend": dist.get_backend(),
                    "per_tensor_ms": 1e3 * statistics.median(per_tensor),
                    "per_unit_ms": 1e3 * statistics.median(per_unit),
                }
            )
        )
    dist.destroy_process_group()


def main() -> None:
    import tempfile

    import torch
    import torch.multiprocessing as mp

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        part = str(Path(tmp) / "rank0.json")
        mp.spawn(_worker, args=(2, _free_port(), args, part), nprocs=2, join=True)
        result = json.loads(Path(part).read_text())
    print(
        f"{'gather':<12} {'ms':>8}   ({result['tensors']} tensors, {args.layers} layers, hidden {args.hidden}, "
        f"2 ranks, {result['backend']}; identical: {result['identical']})"
    )
    print(f"{'per tensor':<12} {result['per_tensor_ms']:>8.1f}")
    print(f"{'per unit':<12} {result['per_unit_ms']:>8.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "weight_gather",
                "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__},
                "settings": {"layers": args.layers, "hidden": args.hidden, "repeats": args.repeats, "ranks": 2},
                "results": result,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    if not result["identical"]:
        raise SystemExit("the two gathers gave different tensors")


if __name__ == "__main__":
    main()
