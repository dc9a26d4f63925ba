"""Asynchronous vs synchronous RL: the same task, warm start and number of samples at
``max_head_offpolicyness`` (eta) = 0 (synchronous), 1, 2 and 4, with long-tailed generation costs.

Every run is ``areal train`` (the real controller, servers and train workers) from one shared SFT
warm start of the demo task, for ``--steps`` RL steps of ``train.batch_size`` samples, with the
``benchmarks.long_tail_workflow`` workflow: the ordinary RLVR episode plus a discarded filler
generation whose length is Pareto-distributed, so episodes have the long tail real rollouts have
(see that module). Reported per eta:

* ``rl_s``: the RL loop's wall time (sum of step times: waiting for the batch, training, the
  weight update; evaluation and start-up excluded), ``samples/s`` = samples trained / ``rl_s``;
* ``wait_s``: time the trainer waited for rollouts; ``update_ms``: mean weight update (write or
  pack, pause, load, resume) and ``paused_ms``: how long the servers were paused for it, each with
  its median over the updates after the first (``update_p50``, ``paused_p50``: the first also sets
  up the collective group's communicator or the shared buffer) and the pause's mean parts (queue:
  waiting for a loop to send the swap, pause, transfer and load, resume);
* ``reward``: the final mean eval reward (4 samples per eval prompt, temperature 1) and the start's;
* staleness of the trained samples (mean, max).

On CPU the trainer, the inference server and the reward workers share the machine's cores, so the
overlap async RL buys is bounded by them. Prints a table and writes
``benchmarks/results/async_vs_sync_<device>.json``.

Usage: ``python benchmarks/async_vs_sync.py [--model DIR] [--sft-steps 150] [--steps 20] [--etas 0 1 2 4]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "demo_grpo.yaml"
WORKFLOW = "benchmarks.long_tail_workflow:LongTailWorkflow"


def warm_start(work: Path, sft_steps: int, extra: list[str]) -> str:
    """SFT from random weights under the same overrides as the RL runs (model shape, devices...)."""
    from areal_tasks.config import load_config
    from areal_tasks.trainer.sft import run_sft

    cfg = load_config(
        CONFIG,
        [
            *extra,
            f"experiment.run_dir={work / 'sft'}",
            f"train.sft_warmup_steps={sft_steps}",
            f"train.total_steps={sft_steps + 1}",
        ],
    )
    return str(run_sft(cfg))


def rl_overrides(run_dir: Path, model: str, eta: int, steps: int, extra: list[str]) -> list[str]:
    """The RL run's overrides: defaults the caller's ``extra`` may change (workflow, learning rate),
    then what this benchmark fixes, last so that it wins: above all the warm-started ``model``,
    whatever ``model.path`` the extras name (that one is what the warm start started from)."""
    return [
        f"rollout.workflow.name={WORKFLOW}",
        "saver.freq_steps=null",
        "actor.optimizer.lr=2e-4",
        *extra,
        f"experiment.run_dir={run_dir}",
        f"model.path={model}",
        "train.sft_warmup_steps=0",
        f"train.total_steps={steps}",
        f"rollout.max_head_offpolicyness={eta}",
    ]


def run_one(work: Path, model: str, eta: int, steps: int, extra: list[str]) -> dict[str, Any]:
    from areal_tasks.config import load_config
    from areal_tasks.trainer.rl import run_train

    run_dir = work / f"eta{eta}"
    cfg = load_config(CONFIG, rl_overrides(run_dir, model, eta, steps, extra))
    summary = run_train(cfg)
    rows = [json.loads(line) for line in (run_dir / "rl_metrics.jsonl").read_text().splitlines()]
    return summarize(eta, rows, summary, cfg.train.batch_size)


def summarize(eta: int, rows: list[dict[str, float]], summary: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """One eta's figures from its per-step metrics (``rows``) and its run summary."""
    rl_s = sum(r["perf/step_s"] for r in rows)
    samples = len(rows) * batch_size
    steady = rows[1:] or rows  # the first update also makes the collective group or the shared buffer
    staleness = summary["executor"]["staleness_hist"]
    n = sum(staleness.values())
    return {
        "eta": eta,
        "steps": len(rows),
        "samples": samples,
        "rl_s": rl_s,
        "samples_per_s": samples / rl_s,
        "wait_s": sum(r["perf/rollout_wait_s"] for r in rows),
        "train_s": sum(r["perf/train_s"] for r in rows),
        "update_ms": 1000 * sum(r["perf/weight_update_s"] for r in rows) / len(rows),
        "paused_ms": 1000 * sum(r["perf/servers_paused_s"] for r in rows) / len(rows),
        # the pause's parts: aborting in-flight requests, the transfer and load, the resume
        **{
            f"{part}_ms": 1000 * sum(r.get(f"perf/weight_{part}_s", 0.0) for r in rows) / len(rows)
            for part in ("queue", "pause", "transfer", "resume", "pack")
        },
        # the steady state: medians over the updates after the first
        "update_p50_ms": 1000 * statistics.median(r["perf/weight_update_s"] for r in steady),
        "paused_p50_ms": 1000 * statistics.median(r["perf/servers_paused_s"] for r in steady),
        "reward_before": summary["reward_before"],
        "reward_after": summary["reward_after"],
        "greedy_accuracy_after": summary["greedy_accuracy_after"],
        "staleness_mean": sum(int(k) * v for k, v in staleness.items()) / max(n, 1),
        "staleness_max": max((int(k) for k in staleness), default=0),
        # the bound in force, and the samples trained after their deadline (possible under "admission")
        "staleness_bound": summary["executor"].get("staleness_bound", "sample"),
        "late_samples": summary["executor"].get("late_samples", 0),
        "wall_s": summary["wall_seconds"],
    }


def format_table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'eta':>3} {'samples':>7} {'rl_s':>7} {'samples/s':>9} {'speed-up':>8} {'wait_s':>7} {'train_s':>7} "
        f"{'update_ms':>9} {'update_p50':>10} {'paused_ms':>9} {'paused_p50':>10} {'queue/pause/xfer/resume ms':>26} "
        f"{'reward':>13} "
        f"{'stale':>9} {'bound':>9} {'late':>5}"
    )
    base = next((r for r in results if r["eta"] == 0), results[0])["samples_per_s"]
    lines = [head]
    for r in results:
        parts = f"{r.get('queue_ms', 0.0):.0f}/{r['pause_ms']:.0f}/{r['transfer_ms']:.0f}/{r['resume_ms']:.0f}"
        lines.append(
            f"{r['eta']:>3} {r['samples']:>7} {r['rl_s']:>7.1f} {r['samples_per_s']:>9.1f} "
            f"{r['samples_per_s'] / base:>7.2f}x "
            f"{r['wait_s']:>7.1f} {r['train_s']:>7.1f} {r['update_ms']:>9.0f} "
            f"{r.get('update_p50_ms', float('nan')):>10.0f} "
            f"{r['paused_ms']:>9.0f} "
            f"{r.get('paused_p50_ms', float('nan')):>10.0f} {parts:>26} "
            f"{r['reward_before']:>5.3f}->{r['reward_after']:.3f} {r['staleness_mean']:>5.2f}/{r['staleness_max']} "
            f"{r.get('staleness_bound', 'sample'):>9} {r.get('late_samples', 0):>5}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="warm-started model dir (default: run the SFT warm start)")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--steps", type=int, default=20, help="RL steps per run")
    parser.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--work", type=Path, default=None, help="run directories (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the controller and the train workers import the benchmark workflow from this repository
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("AREAL_BENCH_SEED", "0")
    import torch

    device = "gpu" if torch.cuda.is_available() else "cpu"
    work = args.work or Path(tempfile.mkdtemp(prefix="async_vs_sync-"))
    started = time.perf_counter()
    model = args.model or warm_start(work, args.sft_steps, list(args.overrides))
    out = args.out or ROOT / "benchmarks" / "results" / f"async_vs_sync_{device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for eta in args.etas:  # the JSON is rewritten after every run, so a cut-short session keeps what ran
        results.append(run_one(work, model, eta, args.steps, list(args.overrides)))
        table = format_table(results)
        payload = {
            "benchmark": "async_vs_sync",
            "device": device,
            "host": {
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "gpus": torch.cuda.device_count(),
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            },
            "settings": {
                "steps": args.steps,
                "etas": args.etas,
                "sft_steps": None if args.model else args.sft_steps,
                "workflow": WORKFLOW,
                "config": str(CONFIG.relative_to(ROOT)),
                "overrides": args.overrides,
                "tail": {
                    k: os.environ.get(k)
                    for k in ("AREAL_BENCH_TAIL_ALPHA", "AREAL_BENCH_TAIL_MIN", "AREAL_BENCH_TAIL_MAX")
                },
            },
            "results": results,
            "table": table,
            "total_s": time.perf_counter() - started,
        }
        out.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    print(format_table(results))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
