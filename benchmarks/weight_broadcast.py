"""NCCL broadcast between two GPU processes, by what each process is allowed to see.

    python benchmarks/weight_broadcast.py [--sizes-mb 64 256 719 1024] [--repeats 5]

The weight update of an RL run is one ``broadcast`` per bucket from the trainer's GPU to the
inference server's. How fast that goes depends on the transport NCCL picks, and that depends on
``CUDA_VISIBLE_DEVICES``: a scheduler that hides every GPU but a worker's own can keep NCCL off
the direct GPU-to-GPU (NVLink) path. This benchmark starts two processes per mode:

- ``own``: each process sees only its GPU (rank 0 ``0``, rank 1 ``1``);
- ``peer``: each sees both, its own first (rank 0 ``0,1``, rank 1 ``1,0``), so ``cuda:0`` is still
  its own GPU.

and times ``broadcast(src=0)`` of a ``uint8`` tensor per size (median of ``--repeats`` after one
warm-up), reporting GB/s and the transport NCCL logged (``NCCL_DEBUG=INFO``'s ``via`` lines).
Prints a table and writes ``benchmarks/results/weight_broadcast.json``. Needs two GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "weight_broadcast.json"
MODES = {"own": ("0", "1"), "peer": ("0,1", "1,0")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, port: int, sizes_mb: list[int], repeats: int, out: str) -> None:
    """One rank: join the two-process NCCL group, time the broadcasts, rank 0 writes ``out``."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, device_id=torch.device("cuda", 0)
    )
    rows = []
    for size_mb in sizes_mb:
        flat = torch.empty(size_mb * 2**20, dtype=torch.uint8, device="cuda")
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            torch.cuda.synchronize()
            started = time.perf_counter()
            dist.broadcast(flat, src=0)
            torch.cuda.synchronize()
            if i:  # the first is a warm-up (connection set-up)
                times.append(time.perf_counter() - started)
        median = statistics.median(times)
        rows.append({"size_mb": size_mb, "ms": median * 1e3, "gb_per_s": size_mb * 2**20 / median / 1e9})
    if rank == 0:
        Path(out).write_text(json.dumps(rows), encoding="utf-8")
    dist.destroy_process_group()


def run_mode(mode: str, sizes_mb: list[int], repeats: int) -> dict:
    """Both ranks of one visibility mode; their rows and the transports NCCL named."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        procs = []
        for rank, visible in enumerate(MODES[mode]):
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible, NCCL_DEBUG="INFO")
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                str(rank),
                "--port",
                str(port),
                "--repeats",
                str(repeats),
                "--out",
                out,
                "--sizes-mb",
                *map(str, sizes_mb),
            ]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=300)[0] for p in procs]
        for p, log in zip(procs, logs):
            if p.returncode != 0:
                raise SystemExit(f"mode {mode}: a rank failed (exit {p.returncode}):\n{log[-3000:]}")
        rows = json.loads(Path(out).read_text(encoding="utf-8"))
    transports = sorted(
        {m.group(1).strip() for log in logs for m in re.finditer(r"Channel \d+/\d+ : .*? via (.+)$", log, re.M)}
    )
    return {"visible": list(MODES[mode]), "rows": rows, "transports": transports}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256, 719, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.port, args.sizes_mb, args.repeats, args.out)
        return 0
    import torch

    if torch.cuda.device_count() < 2:
        print(f"needs two GPUs, this machine has {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    results = {mode: run_mode(mode, args.sizes_mb, args.repeats) for mode in MODES}
    print(f"{'mode':<6} {'CUDA_VISIBLE_DEVICES':<22} {'MB':>6} {'ms':>8} {'GB/s':>8}  transport")
    for mode, res in results.items():
        for row in res["rows"]:
            print(
                f"{mode:<6} {' / '.join(res['visible']):<22} {row['size_mb']:>6} {row['ms']:>8.2f} "
                f"{row['gb_per_s']:>8.1f}  {', '.join(res['transports']) or '?'}"
            )
    payload = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "repeats": args.repeats,
        "modes": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
