"""Checkpoint I/O: save and load throughput of the CheckpointManager against a raw copy of the same
bytes, on local disk and on an S3 server (SeaweedFS on loopback), plus async and incremental saves.

* **full save / load**: a model of ``--param-mb`` MiB of fp32 parameters with its AdamW state (about
  3x that in total) saved by ``CheckpointManager.save`` (non-incremental) and loaded into a fresh
  engine by ``CheckpointManager.load``. The raw baseline writes the checkpoint's data-file bytes
  through the same ``Storage`` (``atomic_write`` in 8 MiB chunks, the path the checkpoint writer
  uses) and reads them back whole. ``ratio`` = checkpoint throughput / raw throughput (1.0 = the
  checkpoint costs no more than moving its bytes). Best of ``--repeats``.
* **async save**: how long ``save()`` blocks the trainer (the host copy) against the full save.
* **incremental (LoRA)**: a tiny-kit Qwen2 model (``--lora-layers`` layers of width
  ``--lora-hidden``) with peft LoRA adapters (r=8 on q/k/v/o) trained a step between saves: data
  bytes written by the first (full) and the following (incremental) checkpoints.

* ``--verify``: only the cost of integrity checks instead. The checkpoint above is loaded with
  hash verification off and on (``recover.verify``: every tensor item's sha256, checked on the read
  threads; alternating, best of ``--repeats``), and checked whole by ``areal checkpoint verify``'s
  deep check and by ``list``'s cheap one; a plain single-thread sha256 over the same bytes is the
  reference. Writes ``benchmarks/results/checkpoint_verify.json``.

One process, CPU. Throughput depends on the disk, the page cache and other load on the machine:
read the ratios, not the absolute numbers. Prints tables and writes
``benchmarks/results/checkpoint_io.json``.

Usage: ``python benchmarks/checkpoint_io.py [--param-mb 64] [--repeats 2] [--no-s3] [--verify]``
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.config.sections import SaverConfig
from areal_tasks.engine.module_state import ModuleCheckpointing
from storage import Storage

logger = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parent / "results" / "checkpoint_io.json"
VERIFY_RESULTS = RESULTS.with_name("checkpoint_verify.json")
CHUNK = 8 * 2**20
MiB = 2**20


class BenchEngine(ModuleCheckpointing):
    """A stack of linear layers holding ``param_mb`` MiB of fp32 parameters, with AdamW state."""

    role = "bench"

    def __init__(self, param_mb: int, seed: int = 0, width: int = 1024) -> None:
        torch.manual_seed(seed)
        layers = max(1, param_mb * MiB // (4 * width * width))
        self.model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.lr_scheduler = None
        self._version = 0
        self.step()

    def step(self) -> None:
        self.model(torch.randn(4, self.model[0].in_features)).square().mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version


class LoraEngine(ModuleCheckpointing):
    """A single-process peft LoRA model over a tiny-kit Qwen2 (base frozen)."""

    role = "actor"

    def __init__(self, hidden: int, layers: int) -> None:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        from areal_tasks.models import build_tiny_model

        torch.manual_seed(0)
        self.model_path = str(
            build_tiny_model(
                "qwen2",
                seed=0,
                hidden_size=hidden,
                intermediate_size=2 * hidden,
                num_hidden_layers=layers,
                head_dim=hidden // 4,
            )
        )
        base = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        self.model = get_peft_model(base, lora)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-3)
        self.lr_scheduler = None
        self._version = 0

    def step(self) -> None:
        ids = torch.randint(0, 1024, (2, 32))
        self.model(input_ids=ids, labels=ids).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = version


def _data_bytes(metadata: Any) -> int:
    return sum(info.size for name, info in metadata.files.items() if name.startswith("dcp/rank-"))


def _raw_copy(storage: Storage, payload: bytes) -> tuple[float, float]:
    """Seconds to write ``payload`` through ``storage`` the way the checkpoint writer does, and to read it."""
    view = memoryview(payload)
    start = time.perf_counter()
    with storage.atomic_write("raw/blob.bin") as handle:
        for offset in range(0, len(view), CHUNK):
            handle.write(view[offset : offset + CHUNK])
    write = time.perf_counter() - start
    start = time.perf_counter()
    back = storage.read_bytes("raw/blob.bin")
    read = time.perf_counter() - start
    if len(back) != len(payload):
        raise RuntimeError(f"raw read returned {len(back)} bytes, wrote {len(payload)}")
    storage.delete("raw", recursive=True)
    return write, read


def bench_full(url: str, options: dict | None, param_mb: int, repeats: int) -> dict[str, Any]:
    """Best-of-``repeats`` full save and load through the manager vs the raw copy of the same bytes."""
    engine = BenchEngine(param_mb)
    saves, loads, raw_w, raw_r = [], [], [], []
    data = 0
    for rep in range(repeats):
        manager = CheckpointManager(url, options, "bench", f"full-{rep}", SaverConfig(keep_last=10), incremental=False)
        start = time.perf_counter()
        meta = manager.save(1, {"m": engine}, TrainerState(step=1)).wait()
        saves.append(time.perf_counter() - start)
        fresh = BenchEngine(param_mb, seed=1)
        start = time.perf_counter()
        manager.load(1, {"m": fresh})
        loads.append(time.perf_counter() - start)
        data = _data_bytes(meta)
        storage = manager.layout.storage
        payload = b"".join(storage.read_bytes(f"step_1/{n}") for n in meta.files if n.startswith("dcp/rank-"))
        w, r = _raw_copy(storage, payload)
        raw_w.append(w)
        raw_r.append(r)
        storage.delete("step_1", recursive=True)
    save, load, rw, rr = min(saves), min(loads), min(raw_w), min(raw_r)
    return {
        "data_bytes": data,
        "save_s": save,
        "load_s": load,
        "raw_write_s": rw,
        "raw_read_s": rr,
        "save_mbps": data / MiB / save,
        "load_mbps": data / MiB / load,
        "raw_write_mbps": data / MiB / rw,
        "raw_read_mbps": data / MiB / rr,
        "save_ratio": rw / save,
        "load_ratio": rr / load,
    }


def bench_async(url: str, options: dict | None, param_mb: int) -> dict[str, Any]:
    engine = BenchEngine(param_mb)
    manager = CheckpointManager(url, options, "bench", "async", SaverConfig(async_save=True), incremental=False)
    start = time.perf_counter()
    ticket = manager.save(1, {"m": engine}, TrainerState(step=1))
    blocked = time.perf_counter() - start
    ticket.wait()
    total = time.perf_counter() - start
    manager.close()
    return {"blocking_s": blocked, "total_s": total}


def bench_lora(url: str, options: dict | None, hidden: int, layers: int) -> dict[str, Any]:
    engine = LoraEngine(hidden, layers)
    manager = CheckpointManager(url, options, "bench", "lora", SaverConfig(keep_last=1))
    rows = []
    for step in (1, 2, 3):
        engine.step()
        start = time.perf_counter()
        meta = manager.save(step, {"actor": engine}, TrainerState(step=step)).wait()
        rows.append(
            {
                "step": step,
                "data_bytes": _data_bytes(meta),
                "referenced_bytes": meta.sizes.referenced,
                "logical_bytes": meta.sizes.logical,
                "save_s": time.perf_counter() - start,
            }
        )
    trainable = sum(p.numel() * 4 for p in engine.model.parameters() if p.requires_grad)
    total = sum(p.numel() * 4 for p in engine.model.parameters())
    return {
        "params_bytes": total,
        "adapter_bytes": trainable,
        "saves": rows,
        "incremental_fraction": rows[-1]["data_bytes"] / rows[0]["data_bytes"],
    }


def bench_verify(url: str, options: dict | None, param_mb: int, repeats: int) -> dict[str, Any]:
    """Load with and without hash checks (alternating, best of ``repeats``), deep and cheap
    ``verify_step``, and a plain sha256 of the same bytes."""
    import hashlib

    from areal_tasks.checkpoint.verify import verify_step

    engine = BenchEngine(param_mb)
    manager = CheckpointManager(url, options, "bench", "verify", SaverConfig(keep_last=10), incremental=False)
    meta = manager.save(1, {"m": engine}, TrainerState(step=1)).wait()
    fresh = BenchEngine(param_mb, seed=1)
    times: dict[str, list[float]] = {"load_s": [], "load_verified_s": [], "deep_verify_s": [], "cheap_verify_s": []}
    for _ in range(repeats):
        for key, verify in (("load_s", False), ("load_verified_s", True)):
            start = time.perf_counter()
            manager.load(1, {"m": fresh}, verify=verify)
            times[key].append(time.perf_counter() - start)
        for key, deep in (("deep_verify_s", True), ("cheap_verify_s", False)):
            start = time.perf_counter()
            report = verify_step(manager.layout, 1, deep=deep)
            times[key].append(time.perf_counter() - start)
            if not report.ok:
                raise RuntimeError(f"the benchmark checkpoint fails verification: {report.problems[0]}")
    data = _data_bytes(meta)
    payload = b"".join(
        manager.layout.storage.read_bytes(f"step_1/{n}") for n in meta.files if n.startswith("dcp/rank-")
    )
    start = time.perf_counter()
    hashlib.sha256(payload).hexdigest()
    sha = time.perf_counter() - start
    manager.layout.storage.delete("step_1", recursive=True)
    best = {key: min(values) for key, values in times.items()}
    return {
        "data_bytes": data,
        **best,
        "sha256_one_thread_s": sha,
        "load_overhead_s": best["load_verified_s"] - best["load_s"],
        "load_overhead_ratio": best["load_verified_s"] / best["load_s"],
        "deep_verify_mbps": data / MiB / best["deep_verify_s"],
        "sha256_one_thread_mbps": data / MiB / sha,
    }


def _print_verify(results: dict[str, Any]) -> None:
    print(f"\nverification cost, {results['param_mb']} MiB of parameters + AdamW state (best of {results['repeats']})")
    print(
        f"{'storage':<8} {'data MiB':>9} {'load s':>7} {'verified':>9} {'ratio':>6} "
        f"{'deep verify s':>14} {'MB/s':>6} {'cheap s':>8} {'sha256 1-thread MB/s':>21}"
    )
    for name, row in results["verify"].items():
        print(
            f"{name:<8} {row['data_bytes'] / MiB:>9.1f} {row['load_s']:>7.3f} {row['load_verified_s']:>9.3f} "
            f"{row['load_overhead_ratio']:>6.2f} {row['deep_verify_s']:>14.3f} {row['deep_verify_mbps']:>6.0f} "
            f"{row['cheap_verify_s']:>8.3f} {row['sha256_one_thread_mbps']:>21.0f}"
        )


def _print(results: dict[str, Any]) -> None:
    print(f"\nfull save/load, {results['param_mb']} MiB of parameters + AdamW state (best of {results['repeats']})")
    print(
        f"{'storage':<8} {'data MiB':>9} {'save MB/s':>10} {'raw write':>10} {'ratio':>6} "
        f"{'load MB/s':>10} {'raw read':>9} {'ratio':>6}"
    )
    for name, row in results["full"].items():
        print(
            f"{name:<8} {row['data_bytes'] / MiB:>9.1f} {row['save_mbps']:>10.0f} {row['raw_write_mbps']:>10.0f} "
            f"{row['save_ratio']:>6.2f} {row['load_mbps']:>10.0f} {row['raw_read_mbps']:>9.0f} "
            f"{row['load_ratio']:>6.2f}"
        )
    print("\nasync save: trainer blocked vs whole save")
    for name, row in results["async"].items():
        print(f"{name:<8} blocked {row['blocking_s']:.3f}s of {row['total_s']:.3f}s")
    print("\nincremental saves, LoRA (frozen base referenced)")
    print(f"{'storage':<8} {'step':>4} {'written MiB':>12} {'referenced MiB':>15} {'save s':>7}")
    for name, lora in results["lora"].items():
        for row in lora["saves"]:
            print(
                f"{name:<8} {row['step']:>4} {row['data_bytes'] / MiB:>12.3f} {row['referenced_bytes'] / MiB:>15.3f} "
                f"{row['save_s']:>7.3f}"
            )
        print(
            f"{name:<8} incremental / full bytes = {lora['incremental_fraction']:.4f} "
            f"(adapters {lora['adapter_bytes'] / MiB:.2f} MiB of {lora['params_bytes'] / MiB:.1f} MiB parameters)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--param-mb", type=int, default=64, help="fp32 parameter MiB of the full-save model")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--lora-hidden", type=int, default=512)
    parser.add_argument("--lora-layers", type=int, default=8)
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 server (local disk only)")
    parser.add_argument("--verify", action="store_true", help="measure only the cost of integrity checks")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"JSON to write (default {RESULTS}, or {VERIFY_RESULTS})"
    )
    args = parser.parse_args()
    out = args.out or (VERIFY_RESULTS if args.verify else RESULTS)
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, Any] = {
        "param_mb": args.param_mb,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "full": {},
        "async": {},
        "lora": {},
        "verify": {},
    }
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as tmp:
        targets: list[tuple[str, str, dict | None]] = [("local", f"file://{tmp}/local", None)]
        server = None
        if not args.no_s3:
            from storage.testing.seaweed import SeaweedS3Server, find_weed_binary

            server = SeaweedS3Server(Path(tmp) / "seaweed", binary=find_weed_binary())
            server.start()
            server.create_bucket("bench")
            targets.append(("s3", "s3://bench/runs", server.storage_options()))
        try:
            for name, url, options in targets:
                if args.verify:
                    results["verify"][name] = bench_verify(url, options, args.param_mb, args.repeats)
                    continue
                results["full"][name] = bench_full(url, options, args.param_mb, args.repeats)
                results["async"][name] = bench_async(url, options, args.param_mb)
                results["lora"][name] = bench_lora(url, options, args.lora_hidden, args.lora_layers)
        finally:
            if server is not None:
                server.stop()
    if args.verify:
        for key in ("full", "async", "lora"):
            results.pop(key)
        _print_verify(results)
    else:
        results.pop("verify")
        _print(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
