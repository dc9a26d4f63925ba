"""Packing efficiency: packed micro-batches (FFD, Karmarkar-Karp) vs naive padding, on CPU.

A long-tailed batch (lognormal lengths clipped to 32..8192, as RL rollouts produce: most answers
short, a few running to the generation limit) is cut into micro-batches four ways:

- ``pad/B``: fixed batches of ``B`` sequences in arrival order, each padded to its longest sequence;
- ``pad-sorted/B``: the same after sorting by length (the usual bucketing trick);
- ``ffd`` / ``kk``: packed with :func:`split_into_micro_batches` under a token cap, optionally with
  alignment padding (``pad_to_multiple_of``).

Reported per row: efficiency = real tokens / computed tokens, the number of micro-batches, balance
= max / mean computed tokens per micro-batch (the slowest micro-batch and the memory peak scale
with the max), and the planning time. A second table compares ``dp_split`` (KK) with contiguous
chunks across 8 data-parallel ranks. Prints tables and writes
``benchmarks/results/packing_efficiency.json``.

Usage: ``python benchmarks/packing_efficiency.py [--sequences 512] [--seed 0]`` (with the package
installed, ``make setup``, or ``PYTHONPATH=.``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.microbatch import dp_split, split_into_micro_batches

RESULTS = Path(__file__).resolve().parent / "results" / "packing_efficiency.json"


def long_tail_lengths(n: int, seed: int, lo: int = 32, hi: int = 8192) -> list[int]:
    """Lognormal lengths (median ~665 tokens, sigma 1.1) clipped to ``[lo, hi]``."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=6.5, sigma=1.1, size=n), lo, hi).astype(int).tolist()


def packed_batch(lengths: list[int]) -> dict[str, torch.Tensor]:
    total = sum(lengths)
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    return {"input_ids": torch.zeros(total, dtype=torch.long), "cu_seqlens": cu, "loss_mask": torch.ones(total)}


def row(name: str, real: int, computed: list[int], seconds: float) -> dict:
    return {
        "method": name,
        "efficiency": real / sum(computed),
        "micro_batches": len(computed),
        "balance_max_over_mean": max(computed) / (sum(computed) / len(computed)),
        "max_mb_tokens": max(computed),
        "plan_ms": seconds * 1e3,
    }


def naive_rows(lengths: list[int], batch_sizes: list[int]) -> list[dict]:
    rows = []
    for sort in (False, True):
        for size in batch_sizes:
            start = time.perf_counter()
            order = sorted(lengths) if sort else lengths
            computed = [len(chunk) * max(chunk) for chunk in (order[i : i + size] for i in range(0, len(order), size))]
            name = f"pad-sorted/{size}" if sort else f"pad/{size}"
            rows.append(row(name, sum(lengths), computed, time.perf_counter() - start))
    return rows


def packed_rows(lengths: list[int], caps: list[int], multiples: list[int]) -> list[dict]:
    batch = packed_batch(lengths)
    rows = []
    for cap in caps:
        for multiple in multiples:
            for method in ("ffd", "kk"):
                spec = MicroBatchSpec(max_tokens_per_mb=cap, packing=method, pad_to_multiple_of=multiple)
                start = time.perf_counter()
                plan = split_into_micro_batches(batch, spec)
                seconds = time.perf_counter() - start
                name = f"{method} cap={cap}" + (f" pad%{multiple}" if multiple > 1 else "")
                rows.append(row(name, plan.n_tokens, plan.tokens_per_micro_batch(), seconds))
    return rows


def dp_rows(lengths: list[int], dp_size: int) -> list[dict]:
    chunk = -(-len(lengths) // dp_size)
    contiguous = [sum(lengths[i : i + chunk]) for i in range(0, len(lengths), chunk)]
    start = time.perf_counter()
    shards = dp_split(packed_batch(lengths), dp_size)
    seconds = time.perf_counter() - start
    balanced = [int(shard["cu_seqlens"][-1]) for shard in shards]
    out = []
    for name, sums, secs in (("contiguous", contiguous, 0.0), ("dp_split (kk)", balanced, seconds)):
        out.append(
            {
                "method": name,
                "ranks": dp_size,
                "max_rank_tokens": max(sums),
                "min_rank_tokens": min(sums),
                "balance_max_over_mean": max(sums) / (sum(sums) / len(sums)),
                "plan_ms": secs * 1e3,
            }
        )
    return out


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = [max(len(c), *(len(_fmt(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r[c]).ljust(w) for c, w in zip(columns, widths)))


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    lengths = long_tail_lengths(args.sequences, args.seed)
    stats = {
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "min": min(lengths),
        "median": int(np.median(lengths)),
        "p95": int(np.percentile(lengths, 95)),
        "max": max(lengths),
    }
    print("lengths:", ", ".join(f"{k} {v}" for k, v in stats.items()), "\n")
    micro = naive_rows(lengths, [4, 16]) + packed_rows(lengths, [8192, 16384, 32768], [1, 128])
    print_table(micro, ["method", "efficiency", "micro_batches", "balance_max_over_mean", "max_mb_tokens", "plan_ms"])
    print()
    dp = dp_rows(lengths, 8)
    print_table(dp, ["method", "ranks", "max_rank_tokens", "min_rank_tokens", "balance_max_over_mean", "plan_ms"])

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"lengths": stats, "seed": args.seed, "micro_batches": micro, "dp": dp}, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
