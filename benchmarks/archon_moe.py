"""Train throughput of a MoE model on one rank: the archon engine (grouped-GEMM and per-expert-loop
expert kernels) against the FSDP engine, on the same model and the same batches.

The model is a random Qwen3-MoE from the tiny-model kit (``build_tiny_model``; no hub needed) with
the shape of ``--preset``: ``moe`` (a few hundred million active parameters, 16 experts, top 2) for
one GPU, ``tiny`` for the CPU dry run (``--dry-run``: the tiny shape, one warm-up step and one timed
step per engine, float32). Batches are the train benchmark's long-tail mixes packed into exactly
``--mbs-per-step`` micro-batches (``train_batches.long_tail_batch`` / ``fill_micro_batches``),
timed as that benchmark times them: after ``--warmup`` untimed steps, ``--steps`` steps back to
back, each step's stats read after the next is submitted.

MFU counts ACTIVE parameters: ``6 * active * tokens`` plus the causal attention matmuls
(``6 * layers * heads * head_dim * sum(L^2)``), as ``train_batches.step_flops`` does, with
``active`` = every parameter less the ``num_experts - num_experts_per_tok`` experts a token skips.
It is given against the measured bf16 matmul peak of an H200 (``--peak-flops``, 795 TFLOP/s) and
against the 989 TFLOP/s spec peak. A table is printed and JSON written
(``benchmarks/results/archon_moe_<preset>.json`` by default); figures go to docs/benchmarks.md.

Usage::

    python benchmarks/archon_moe.py --dry-run          # CPU, seconds
    python benchmarks/archon_moe.py --preset moe       # one GPU
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from train_batches import (  # benchmarks/ is the script's directory, first on sys.path
    fill_micro_batches,
    long_tail_batch,
    pg_loss,
    step_flops,
    token_weight,
)
from train_throughput import _init_distributed
from train_timing import _sync, _timed_pipelined

from areal_tasks.config.engine import ArchonConfig, EngineConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.parallel.mesh import ParallelDims

logger = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SPEC_PEAK_FLOPS = 989e12  # H200 dense bf16, the vendor's figure

PRESETS: dict[str, dict[str, int]] = {
    "moe": {
        "hidden_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 2048,
        "max_position_embeddings": 16384,
        "tokens_per_mb": 8192,
    },
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "max_position_embeddings": 2048,
        "tokens_per_mb": 256,
    },
}

#: (label, backend, archon moe_kernel)
CASES: tuple[tuple[str, str, str], ...] = (
    ("archon grouped_mm", "archon", "grouped_mm"),
    ("archon loop", "archon", "loop"),
    ("fsdp", "fsdp", "auto"),
)


def active_params(total: int, shape: dict[str, int]) -> int:
    """``total`` less the experts a token does not run (gate, up and down projections each)."""
    skipped = shape["num_experts"] - shape["num_experts_per_tok"]
    per_expert = 3 * shape["hidden_size"] * shape["moe_intermediate_size"]
    return total - shape["num_hidden_layers"] * skipped * per_expert


def _engine(backend: str, kernel: str, model_dir: Path, cfg: dict[str, Any], total_steps: int) -> Any:
    config = EngineConfig(backend=backend, archon=ArchonConfig(moe_kernel=kernel), **cfg)
    if backend == "archon":
        from areal_tasks.engine.archon.engine import ArchonEngine

        return ArchonEngine(config, str(model_dir), parallel=ParallelDims(), total_steps=total_steps)
    from areal_tasks.engine.fsdp.engine import FSDPEngine

    return FSDPEngine(config, str(model_dir), parallel=ParallelDims(), total_steps=total_steps)


def run_case(
    label: str, backend: str, kernel: str, model_dir: Path, shape: dict, batches: list[dict], args: argparse.Namespace
) -> dict[str, Any]:
    """Warm up, time, and return the figures of one engine on ``batches``."""
    cfg = {
        "optimizer": OptimizerConfig(lr=1e-6, grad_clip=1.0),
        "micro_batch": MicroBatchSpec(n_mbs=1, max_tokens_per_mb=args.tokens_per_mb),
        "dtype": args.dtype,
    }
    engine = _engine(backend, kernel, model_dir, cfg, args.warmup + args.steps)
    engine.initialize()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    total = sum(p.numel() for p in engine.model.parameters())
    active = active_params(total, shape)
    for batch in batches[: args.warmup]:
        engine.train_batch(batch, pg_loss, token_weight)
    _sync()
    timed = batches[args.warmup :]
    times, results = _timed_pipelined(engine, timed)
    tokens = sum(r["n_tokens"] for r in results)
    flops = sum(step_flops(b, active, shape) for b in timed)
    kernels = getattr(engine, "kernels", {})
    engine.destroy()
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {
        "engine": label,
        "backend": backend,
        "moe_kernel": kernel,
        "kernels": {k: str(v) for k, v in kernels.items()},
        "params_total": total,
        "params_active": active,
        "step_times_s": times,
        "step_time_s_median": statistics.median(times),
        "tokens_per_step": tokens / len(times),
        "tokens_per_s": tokens / sum(times),
        "mfu_measured_peak": flops / sum(times) / args.peak_flops,
        "mfu_spec_peak": flops / sum(times) / SPEC_PEAK_FLOPS,
        "loss_last": float(results[-1].get("loss", float("nan"))),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from areal_tasks.models import build_tiny_model

    _init_distributed()
    shape = {k: v for k, v in PRESETS[args.preset].items() if k != "tokens_per_mb"}
    args.tokens_per_mb = args.tokens_per_mb or PRESETS[args.preset]["tokens_per_mb"]
    model_dir = build_tiny_model("qwen3_moe", cache_dir=args.model_root, **shape)
    spec = MicroBatchSpec(n_mbs=1, max_tokens_per_mb=args.tokens_per_mb)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    batches = [
        fill_micro_batches(
            long_tail_batch(args.mbs_per_step * args.tokens_per_mb, args.tokens_per_mb, vocab, seed=1000 * step),
            spec,
            args.mbs_per_step,
        )
        for step in range(args.warmup + args.steps)
    ]
    cases = [c for c in CASES if c[0] in args.engines]
    rows = [run_case(*case, model_dir, shape, batches, args) for case in cases]
    return {
        "preset": args.preset,
        "shape": shape,
        "tokens_per_mb": args.tokens_per_mb,
        "mbs_per_step": args.mbs_per_step,
        "warmup": args.warmup,
        "steps": args.steps,
        "dtype": args.dtype,
        "peak_flops": args.peak_flops,
        "spec_peak_flops": SPEC_PEAK_FLOPS,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "results": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    """One row an engine: tokens/s, median step time, MFU against both peaks, peak memory."""
    head = f"{'engine':<18} {'tokens/s':>10} {'step s':>7} {'MFU meas.':>9} {'MFU spec':>8} {'mem GiB':>7}"
    lines = [head, "-" * len(head)]
    for r in result["results"]:
        mem = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] is not None else "n/a"
        lines.append(
            f"{r['engine']:<18} {r['tokens_per_s']:>10.0f} {r['step_time_s_median']:>7.3f} "
            f"{100 * r['mfu_measured_peak']:>8.1f}% {100 * r['mfu_spec_peak']:>7.1f}% {mem:>7}"
        )
    first = result["results"][0]
    lines.append(
        f"params: {first['params_active'] / 1e6:.0f} M active of {first['params_total'] / 1e6:.0f} M; "
        f"{first['tokens_per_step']:.0f} tokens/step; {result['device']}"
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="moe")
    parser.add_argument("--dry-run", action="store_true", help="tiny shape, 1 warm-up and 1 timed step, CPU-sized")
    parser.add_argument("--tokens-per-mb", type=int, default=None)
    parser.add_argument("--mbs-per-step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--engines", nargs="+", default=[c[0] for c in CASES], choices=[c[0] for c in CASES])
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="default: bf16 on CUDA")
    parser.add_argument("--peak-flops", type=float, default=795e12, help="measured bf16 matmul peak of one device")
    parser.add_argument("--model-root", default=str(Path(tempfile.gettempdir()) / "areal_bench_models"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.dry_run:
        args.preset, args.warmup, args.steps, args.mbs_per_step = "tiny", 1, 1, 1
        if "archon grouped_mm" in args.engines and not torch.cuda.is_available():
            args.engines = [e for e in args.engines if e != "archon grouped_mm"]  # CUDA-only kernel
    if args.dtype is None:
        args.dtype = "bfloat16" if torch.cuda.is_available() else "float32"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    print(format_table(result))
    out = args.out or RESULTS_DIR / f"archon_moe_{result['preset']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
