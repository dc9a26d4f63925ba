"""Asynchronous vs synchronous RL: the same task, warm start and number of samples at
``max_head_offpolicyness`` (eta) = 0 (synchronous), 1, 2 and 4, with long-tailed generation costs.

Every run is ``areal train`` (the real controller, servers and train workers) from one shared SFT
warm start of the demo task, for ``--steps`` RL steps of ``train.batch_size`` samples, with the
``benchmarks.long_tail_workflow`` workflow: the ordinary RLVR episode plus a discarded filler
generation whose length is Pareto-distributed, so episodes have the long tail real rollouts have
(see that module).

The first ``--warmup-steps`` RL steps (default 2) are the warm-up: they run ``torch.compile``'s
compilation of the train and log-prob graphs (a first shape, then recompilations for new ones), and
the first weight update sets up the collective group or the shared buffer. On one H200 the first two
steps took 78 s of a 10-step run whose other steps took about 1 s each, so the warm-up is left out of
the throughput and reported on its own. Reported per eta (from the run's per-step metrics,
``rl_metrics.jsonl``, and its summary):

* ``warmup_s``: the warm-up steps' seconds (``warmup_train_s`` of it training);
* ``samples_per_s``: samples trained / seconds over the steady window, the steps after the warm-up
  (``perf/step_s``: waiting for the batch, training, the weight update; evaluation and start-up
  excluded); ``speed_up`` over eta=0; ``samples_per_s_all`` over every step, the warm-up included;
  ``samples_per_s_late`` without the first eta steady steps too (at eta > 0 the servers may
  generate up to eta batches ahead while the trainer compiles, a head start the window begins with);
* ``gen_s`` (G: waiting for the batch, at eta=0 the whole generation), ``train_s`` (T) and
  ``update_s``: means per steady step; ``overlap_efficiency`` = speed-up / ((G + T) / max(G, T))
  with the synchronous run's G and T: the share reached of the speed-up that hiding the shorter of
  generation and training entirely behind the longer would give;
* the weight update over steps 2 onward (the first also sets up the group or buffer:
  ``first_update_ms``), median, p90 and max in ms: ``update`` (write or pack, pause, load, resume),
  ``paused`` (the servers' pause) and its parts ``queue`` (waiting for a loop to send the swap),
  ``pause``, ``transfer`` (and load), ``resume``, and ``pack``;
* ``reward``: the final mean eval reward (4 samples per eval prompt, temperature 1) and the start's;
* staleness of the trained samples (mean, max), the bound in force, the samples trained late.

On CPU the trainer, the inference server and the reward workers share the machine's cores, so the
overlap async RL buys is bounded by them. Prints the tables and writes
``benchmarks/results/async_vs_sync_<device>_steady.json`` (``--out`` names another).

Usage: ``python benchmarks/async_vs_sync.py [--model DIR] [--sft-steps 150] [--steps 32] [--warmup-steps 2]
[--etas 0 1 2 4] [-- OVERRIDES...]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from areal_tasks.errors import ConfigError

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


def run_one(work: Path, model: str, eta: int, steps: int, warmup_steps: int, extra: list[str]) -> dict[str, Any]:
    from areal_tasks.config import load_config
    from areal_tasks.trainer.rl import run_train

    run_dir = work / f"eta{eta}"
    cfg = load_config(CONFIG, rl_overrides(run_dir, model, eta, steps, extra))
    summary = run_train(cfg)
    rows = [json.loads(line) for line in (run_dir / "rl_metrics.jsonl").read_text().splitlines()]
    return summarize(eta, rows, summary, cfg.train.batch_size, warmup_steps)


def split_warmup(
    rows: list[dict[str, float]], warmup_steps: int
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The warm-up steps (the first ``warmup_steps``) and the steady window (every step after them)."""
    if warmup_steps < 0:
        raise ConfigError(f"--warmup-steps must be 0 or more, got {warmup_steps}")
    if len(rows) <= warmup_steps:
        raise ConfigError(
            f"{len(rows)} RL steps leave no step after {warmup_steps} warm-up steps: raise --steps "
            f"(30 or more after the warm-up give a steady figure) or lower --warmup-steps"
        )
    return rows[:warmup_steps], rows[warmup_steps:]


def spread(values: list[float]) -> dict[str, float]:
    """Median, 90th percentile (nearest rank: the smallest value with 90% of them at or below it)
    and maximum of ``values``, which must not be empty."""
    if not values:
        raise ConfigError("spread() needs at least one value: the run logged no step to summarize")
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[math.ceil(0.9 * len(ordered)) - 1],
        "max": ordered[-1],
    }


def overlap_efficiency(speed_up: float, gen_s: float, train_s: float) -> float:
    """The share of the ideal overlap a speed-up reaches: ``speed_up / ((G + T) / max(G, T))``.

    ``G`` and ``T`` are the synchronous run's per-step generation (rollout wait) and training
    times; ``(G + T) / max(G, T)`` is the speed-up of a loop that hid the shorter of the two
    entirely behind the longer one (1.0 is that ideal, 1/ideal no overlap at all)."""
    longer = max(gen_s, train_s)
    if longer <= 0:
        raise ConfigError(f"the synchronous run's per-step times must be positive, got G={gen_s}, T={train_s}")
    return speed_up / ((gen_s + train_s) / longer)


#: the weight update's timings, per step: the whole update, the servers' pause, and the pause's parts
#: (waiting for a control loop to send the swap, pausing, the transfer and load, resuming) and the pack
UPDATE_PARTS = {
    "update": "perf/weight_update_s",
    "paused": "perf/servers_paused_s",
    "queue": "perf/weight_queue_s",
    "pause": "perf/weight_pause_s",
    "transfer": "perf/weight_transfer_s",
    "resume": "perf/weight_resume_s",
    "pack": "perf/weight_pack_s",
}


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(r.get(key, 0.0) for r in rows) / len(rows)


def summarize_steps(eta: int, rows: list[dict[str, float]], batch_size: int, warmup_steps: int = 2) -> dict[str, Any]:
    """One eta's figures from its per-step metrics alone (``rows``, one per RL step): no reward,
    and the staleness from the steps' own figures where they logged them (else None).

    Throughput comes from the steady window, the steps after the first ``warmup_steps`` (their
    seconds are reported as ``warmup_s``); the weight update's spread from steps 2 onward (the first
    update also sets up the collective group or the shared buffer, ``first_update_ms``)."""
    warmup, steady = split_warmup(rows, warmup_steps)
    steady_s = sum(r["perf/step_s"] for r in steady)
    samples = len(steady) * batch_size
    # at eta > 0 the servers may generate up to eta batches ahead during the warm-up, so the window
    # starts with a head start; the figure without the first eta steady steps shows its weight
    late = steady[eta:]
    updates = rows[1:] or rows
    logged_staleness = all("staleness/mean" in r and "staleness/max" in r for r in rows)
    result: dict[str, Any] = {
        "eta": eta,
        "steps": len(rows),
        "warmup_steps": len(warmup),
        "steady_steps": len(steady),
        "samples": samples,
        "warmup_s": sum(r["perf/step_s"] for r in warmup),
        "warmup_train_s": sum(r["perf/train_s"] for r in warmup),
        "rl_s": sum(r["perf/step_s"] for r in rows),
        "samples_per_s_all": len(rows) * batch_size / sum(r["perf/step_s"] for r in rows),
        "steady_s": steady_s,
        "samples_per_s": samples / steady_s,
        "samples_per_s_late": len(late) * batch_size / sum(r["perf/step_s"] for r in late) if late else None,
        # per steady step: G (waiting for the batch: the generation at eta=0), T (training), the update
        "gen_s": _mean(steady, "perf/rollout_wait_s"),
        "train_s": _mean(steady, "perf/train_s"),
        "update_s": _mean(steady, "perf/weight_update_s"),
        "wait_total_s": sum(r["perf/rollout_wait_s"] for r in steady),
        "train_total_s": sum(r["perf/train_s"] for r in steady),
        "first_update_ms": 1000 * rows[0]["perf/weight_update_s"],
        "reward_before": None,
        "reward_after": None,
        "greedy_accuracy_after": None,
        "staleness_mean": _mean(rows, "staleness/mean") if logged_staleness else None,
        "staleness_max": int(max(r["staleness/max"] for r in rows)) if logged_staleness else None,
        "staleness_bound": None,
        "late_samples": int(sum(r.get("rollout/late_samples", 0.0) for r in rows)),
        "wall_s": None,
    }
    for part, key in UPDATE_PARTS.items():
        for stat, value in spread([r.get(key, 0.0) for r in updates]).items():
            result[f"{part}_{stat}_ms"] = 1000 * value
    return result


def summarize(
    eta: int, rows: list[dict[str, float]], summary: dict[str, Any], batch_size: int, warmup_steps: int = 2
) -> dict[str, Any]:
    """One eta's figures: :func:`summarize_steps` of its per-step metrics, with the reward, the
    staleness histogram's mean and max, the bound and the late samples from its run summary."""
    staleness = summary["executor"]["staleness_hist"]
    n = sum(staleness.values())
    return {
        **summarize_steps(eta, rows, batch_size, warmup_steps),
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


def summarize_kept(specs: list[str], warmup_steps: int) -> list[dict[str, Any]]:
    """``ETA=PATH`` each: a finished run's kept per-step metrics (``rl_metrics.jsonl``, as
    ``gpu_suite.sh`` keeps them) summarized again, the batch size read from ``rollout/n_samples``."""
    results = []
    for spec in specs:
        eta_text, sep, path = spec.partition("=")
        if not sep or not eta_text.strip().isdigit():
            raise ConfigError(f"--metrics takes ETA=PATH (e.g. 2=runs/eta2/rl_metrics.jsonl), got {spec!r}")
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        sizes = {r.get("rollout/n_samples") for r in rows}
        if len(sizes) != 1 or None in sizes:
            raise ConfigError(
                f"{path}: every step needs the same rollout/n_samples to count samples, found {sorted(map(str, sizes))}"
            )
        results.append(summarize_steps(int(eta_text), rows, int(sizes.pop()), warmup_steps))
    return results


def compare(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each result's ``speed_up`` over the synchronous (eta=0) run and its ``overlap_efficiency``
    (set in place; None without an eta=0 run); returns the synchronous run's G, T and ideal speed-up."""
    base = next((r for r in results if r["eta"] == 0), None)
    if base is None:
        for r in results:
            r["speed_up"] = r["overlap_efficiency"] = None
        return None
    gen_s, train_s = base["gen_s"], base["train_s"]
    for r in results:
        r["speed_up"] = r["samples_per_s"] / base["samples_per_s"]
        r["overlap_efficiency"] = overlap_efficiency(r["speed_up"], gen_s, train_s)
    return {"gen_s": gen_s, "train_s": train_s, "ideal_speed_up": (gen_s + train_s) / max(gen_s, train_s)}


def _num(value: float | None, width: int, spec: str, suffix: str = "") -> str:
    return f"{'-':>{width}}" if value is None else f"{format(value, spec) + suffix:>{width}}"


def _reward(r: dict[str, Any]) -> str:
    return "-" if r["reward_before"] is None else f"{r['reward_before']:.3f}->{r['reward_after']:.3f}"


def _staleness(r: dict[str, Any]) -> str:
    return "-" if r["staleness_mean"] is None else f"{r['staleness_mean']:.2f}/{r['staleness_max']}"


def format_table(results: list[dict[str, Any]]) -> str:
    """Two tables: throughput (steady window) and the weight update (steps 2 onward)."""
    sync = compare(results)
    head = (
        f"{'eta':>3} {'steps':>7} {'warmup_s':>8} {'samples/s':>9} {'speed-up':>8} {'late s/s':>8} "
        f"{'G s':>6} {'T s':>6} {'overlap':>7} {'reward':>13} {'stale':>9} {'bound':>9} {'late':>5}"
    )
    lines = [head]
    for r in results:
        lines.append(
            f"{r['eta']:>3} {str(r['warmup_steps']) + '+' + str(r['steady_steps']):>7} {r['warmup_s']:>8.1f} "
            f"{r['samples_per_s']:>9.1f} {_num(r['speed_up'], 8, '.2f', 'x')} "
            f"{_num(r['samples_per_s_late'], 8, '.1f')} "
            f"{r['gen_s']:>6.3f} {r['train_s']:>6.3f} {_num(r['overlap_efficiency'], 7, '.2f')} "
            f"{_reward(r):>13} {_staleness(r):>9} {r['staleness_bound'] or '-':>9} {r['late_samples']:>5}"
        )
    if sync is not None:
        lines.append(
            f"synchronous run per step: G={sync['gen_s']:.3f} s, T={sync['train_s']:.3f} s; "
            f"ideal speed-up (G+T)/max(G,T) = {sync['ideal_speed_up']:.2f}x; overlap = speed-up / ideal"
        )
    lines.append("")
    lines.append(
        f"{'eta':>3} {'first ms':>8} "
        + " ".join(f"{part + ' p50/p90/max ms':>24}" for part in ("update", "paused", "pause", "transfer", "resume"))
    )
    for r in results:
        cells = [
            f"{r[f'{part}_p50_ms']:.1f}/{r[f'{part}_p90_ms']:.1f}/{r[f'{part}_max_ms']:.1f}"
            for part in ("update", "paused", "pause", "transfer", "resume")
        ]
        lines.append(f"{r['eta']:>3} {r['first_update_ms']:>8.1f} " + " ".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)


def rescore(specs: list[str], warmup_steps: int, out: Path | None) -> None:
    """``--metrics``: print (and with ``out``, write) the summary of kept per-step metrics."""
    results = summarize_kept(specs, warmup_steps)
    table = format_table(results)
    print(table)
    if out is not None:
        payload = {
            "benchmark": "async_vs_sync",
            "rescored_from": specs,
            "settings": {"warmup_steps": warmup_steps},
            "synchronous": compare(results),
            "results": results,
            "table": table,
        }
        out.write_text(json.dumps(payload, indent=2), encoding="utf-8")
        print(f"written to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="warm-started model dir (default: run the SFT warm start)")
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--steps", type=int, default=32, help="RL steps per run, the warm-up steps included")
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        help="first RL steps left out of the throughput (torch.compile's warm-up, the first weight update); "
        "reported separately as warmup_s",
    )
    parser.add_argument("--etas", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--work", type=Path, default=None, help="run directories (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=None,
        metavar="ETA=PATH",
        help="run nothing: summarize finished runs' kept per-step metrics (rl_metrics.jsonl) again "
        "with --warmup-steps (no reward; JSON only with --out)",
    )
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every run")
    args = parser.parse_args()
    if args.metrics:
        rescore(args.metrics, args.warmup_steps, args.out)
        return
    if not 0 <= args.warmup_steps < args.steps:
        parser.error(
            f"--warmup-steps {args.warmup_steps} must be at least 0 and below --steps {args.steps}, "
            "so that steps remain to time (30 or more after the warm-up give a steady figure)"
        )
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
    out = args.out or ROOT / "benchmarks" / "results" / f"async_vs_sync_{device}_steady.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for eta in args.etas:  # the JSON is rewritten after every run, so a cut-short session keeps what ran
        results.append(run_one(work, model, eta, args.steps, args.warmup_steps, list(args.overrides)))
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
                "warmup_steps": args.warmup_steps,
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
            "synchronous": compare(results),
            "results": results,
            "table": table,
            "total_s": time.perf_counter() - started,
        }
        out.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    print(format_table(results))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
