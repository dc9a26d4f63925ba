"""Does the demo learn beyond noise? The demo job (``configs/demo_grpo.yaml``) on several seeds.

Each row is one ``areal train`` of the demo config with ``experiment.seed=S`` (and any overrides
given after ``--``), in its own run directory; ``--parallel`` jobs run at once (each uses about two
cores: its two gloo workers during the warm start, then the server and the trainer). It prints the
eval reward (100 prompts x 4 samples at temperature 1) and the greedy accuracy before and after RL
for every seed, then the smallest and largest change, and writes ``benchmarks/results/demo_seeds.json``
(a list of rows; ``--out`` for another path). The figures and the machine they ran on:
docs/training.md, "The demo".

    python benchmarks/demo_seeds.py                          # seeds 1 2 3, one at a time
    python benchmarks/demo_seeds.py --seeds 1 2 3 4 5 6 --parallel 6 -- train.sft_warmup_steps=150
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "demo_seeds.json"
CONFIG = "configs/demo_grpo.yaml"
SUMMARY_KEYS = (
    "reward_before",
    "reward_after",
    "greedy_accuracy_before",
    "greedy_accuracy_after",
    "sft_wall_s",
    "sft_loss_last",
    "wall_seconds",
)


def run_seed(seed: int, overrides: list[str], runs: Path, config: str) -> dict[str, Any]:
    """One demo job on ``seed``; its summary's figures (or the log's tail when it failed)."""
    run_dir = runs / f"seed_{seed}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "areal_tasks.cli", "train", "--config", config]
    cmd += [f"experiment.run_dir={run_dir}", f"experiment.seed={seed}", *overrides]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    row: dict[str, Any] = {"seed": seed, "rc": proc.returncode, "wall_s": round(time.perf_counter() - started, 1)}
    summary_path = run_dir / "summary.json"
    if proc.returncode == 0 and summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        row.update({key: summary.get(key) for key in SUMMARY_KEYS})
        row["reward_gain"] = summary["reward_after"] - summary["reward_before"]
        row["greedy_change"] = summary["greedy_accuracy_after"] - summary["greedy_accuracy_before"]
    else:
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per seed, then the spread of the two changes."""
    print(f"{'seed':>4} {'eval reward':>17} {'gain':>7} {'greedy accuracy':>17} {'change':>7} {'wall s':>7}")
    for row in rows:
        if row["rc"] != 0:
            print(f"{row['seed']:>4} failed (rc {row['rc']}): {row['error'][-300:]}")
            continue
        print(
            f"{row['seed']:>4} {row['reward_before']:>8.3f} -> {row['reward_after']:.3f} {row['reward_gain']:>+7.3f} "
            f"{row['greedy_accuracy_before']:>8.2f} -> {row['greedy_accuracy_after']:.2f} "
            f"{row['greedy_change']:>+7.2f} {row['wall_s']:>7.0f}"
        )
    done = [r for r in rows if r["rc"] == 0]
    if done:
        gains = [r["reward_gain"] for r in done]
        changes = [r["greedy_change"] for r in done]
        print(
            f"reward gain {min(gains):+.3f} .. {max(gains):+.3f}; greedy change {min(changes):+.2f} .. "
            f"{max(changes):+.2f} over {len(done)} seed(s)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--parallel", type=int, default=1, help="jobs at once (each wants about 2 cores)")
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--runs", type=Path, default=None, help="parent of the run directories (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("overrides", nargs="*", help="config overrides for every seed (after --)")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel={args.parallel} must be >= 1")
    runs = args.runs or Path(tempfile.mkdtemp(prefix="demo_seeds_"))
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(run_seed, seed, args.overrides, runs, args.config) for seed in args.seeds]
        rows = [f.result() for f in tqdm(futures, desc="demo seeds", unit="run", file=sys.stderr)]
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"config": args.config, "overrides": args.overrides, "cpus": os.cpu_count(), "rows": rows}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
