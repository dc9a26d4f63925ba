"""What the perf tracer costs: per span (off, on, on but the step not sampled) and per RL step of the demo.

``--micro`` times ``with span(...)`` in a loop (no processes: seconds). The full run (default)
trains the demo config (``configs/demo_grpo.yaml``, no SFT warm start, ``--steps`` RL steps) with
``trace.enabled`` true and false, alternating, ``--repeats`` times each, and compares the median
``perf/step_s`` of ``rl_metrics.jsonl`` (steps after the first). On a busy 2-core machine the step
time's noise is larger than the tracer's cost, so it also reports the estimate that noise does not
blur: spans recorded per step (counted in the run's ``trace.json``, all processes) times the cost of
one span, as a fraction of the step time. Prints a table; writes ``benchmarks/results/trace_overhead.json``
(``--out`` for another path). The figures: docs/benchmarks.md.

    python benchmarks/trace_overhead.py --micro
    python benchmarks/trace_overhead.py --steps 6 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from areal_tasks import trace  # noqa: E402
from areal_tasks.trace.tracer import Tracer  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "trace_overhead.json"


def per_span_ns(n: int, directory: Path) -> dict[str, float]:
    """Nanoseconds of one ``with span("x", "train", i=...)``: no tracer, tracer on, step not sampled."""

    def loop(count: int) -> float:
        started = time.perf_counter_ns()
        for i in range(count):
            with trace.span("micro-batch forward", "train", micro_batch=i):
                pass
        return (time.perf_counter_ns() - started) / count

    trace.uninstall()
    off = min(loop(n) for _ in range(3))
    tracer = trace.install(Tracer(directory, "benchmark", every_n_steps=2, max_events=10 * n))
    tracer.set_step(1)
    on = min(loop(n // 4) for _ in range(3))
    tracer.set_step(2)
    skipped = min(loop(n) for _ in range(3))
    trace.uninstall()
    return {"off_ns": off, "on_ns": on, "not_sampled_ns": skipped}


def run_demo(run_dir: Path, steps: int, enabled: bool, overrides: list[str]) -> dict[str, Any]:
    """One demo run; its median step time (steps after the first) and, traced, spans per step."""
    from areal_tasks.config import load_config
    from areal_tasks.trainer.rl import run_train

    cfg = load_config(
        "configs/demo_grpo.yaml",
        [
            f"experiment.run_dir={run_dir}",
            "train.sft_warmup_steps=0",
            f"train.total_steps={steps}",
            "saver.freq_steps=null",
            "dataset.path=demo:arithmetic?digits=2&ops=>&n_train=3000&n_eval=16",
            f"trace.enabled={str(enabled).lower()}",
            *overrides,
        ],
    )
    run_train(cfg)
    rows = [json.loads(line) for line in (run_dir / "rl_metrics.jsonl").read_text().splitlines() if line]
    step_s = [r["perf/step_s"] for r in rows if r["step"] > 1]
    out: dict[str, Any] = {"trace": enabled, "median_step_s": statistics.median(step_s), "step_s": step_s}
    if enabled:
        doc = json.loads((run_dir / "trace.json").read_text())
        in_steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("args", {}).get("step") is not None]
        per_step = [sum(1 for e in in_steps if e["args"]["step"] == s) for s in range(2, steps + 1)]
        out["spans_per_step"] = statistics.median(per_step)
        out["problems"] = len(trace.check_trace(doc))
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", action="store_true", help="only the per-span cost (seconds, no processes)")
    parser.add_argument("--spans", type=int, default=200_000, help="spans timed per case (--micro)")
    parser.add_argument("--steps", type=int, default=6, help="RL steps per demo run")
    parser.add_argument("--repeats", type=int, default=2, help="demo runs per setting (alternating)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("overrides", nargs="*", help="config overrides for the demo runs")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["trace_overhead.py", *sys.argv[1:]]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        micro = per_span_ns(args.spans, Path(tmp) / "trace")
    result["per_span"] = micro
    print(f"{'span':<24} {'ns':>8}")
    for key, value in micro.items():
        print(f"{key:<24} {value:>8.0f}")
    if not args.micro:
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats):
                for enabled in (True, False):
                    runs.append(run_demo(Path(tmp) / f"run{r}_{int(enabled)}", args.steps, enabled, args.overrides))
        on = statistics.median(x["median_step_s"] for x in runs if x["trace"])
        off = statistics.median(x["median_step_s"] for x in runs if not x["trace"])
        spans = statistics.median(x["spans_per_step"] for x in runs if x["trace"])
        estimate = spans * micro["on_ns"] * 1e-9 / off
        result.update(
            {
                "runs": runs,
                "median_step_s_on": on,
                "median_step_s_off": off,
                "measured_overhead": on / off - 1,
                "spans_per_step": spans,
                "estimated_overhead": estimate,
            }
        )
        print(f"\n{'trace':<8} {'median perf/step_s':>20}")
        print(f"{'on':<8} {on:>20.3f}\n{'off':<8} {off:>20.3f}")
        print(f"measured: {100 * (on / off - 1):+.1f}% (noise included); spans per step {spans:.0f}")
        print(f"estimated: {spans:.0f} spans x {micro['on_ns']:.0f} ns / {off:.3f} s = {100 * estimate:.3f}%")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
