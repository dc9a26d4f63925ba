"""The engine's own host work a decode step, with the forward taken out (CPU).

On a GPU the embedded server's decode steps at large batches are host-bound (docs/benchmarks.md:
2.5-2.8 ms of host time a step against about 1.9 ms of device time, greedy at batch 256 on an
H200): the per-row Python of the engine loop (``decode_step.py``: building a step's inputs,
extending outputs and checking finish rules, retiring finished rows) runs once a step for every
running sequence. This benchmark measures that Python alone, on the CPU, by running the real
:class:`~areal_tasks.inference.server.engine.Engine` over a runner whose decode forward costs
nothing (it returns fixed logits and advances the cache lengths, as a forward would) and timing
each part of the step:

* ``launch``: compaction and the step's inputs (``_launch`` less the forward call);
* ``collect``: the read-back of the step before and the per-row finish checks (``_collect``);
* ``retire``, ``set aside``, ``sampling table``: the rest of the per-step bookkeeping;
* ``engine total``: the whole step less the forward and the sampling ops (which run on the device
  on a GPU).

Every prompt of a batch is submitted at once and decodes ``--new-tokens`` greedy tokens (EOS
ignored), so every step has the full batch. Each batch runs ``--repeats`` times; each part reports
the fastest run's microseconds a step. Prints a table and writes JSON
(``benchmarks/results/engine_host_overhead_cpu.json`` by default).

Usage::

    python benchmarks/engine_host_overhead.py                    # batches 64, 256, 1024; ~1 min
    python benchmarks/engine_host_overhead.py --batches 256 --repeats 5
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from inference_runs import run_engine  # benchmarks/, the script's directory

from areal_tasks.inference.server import decode_step
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig

RESULTS = Path(__file__).resolve().parent / "results"
#: the parts of a step timed on their own (method names of the engine) and their labels.
PARTS = {
    "_launch": "launch",
    "_collect": "collect",
    "_retire_finished": "retire",
    "_set_aside_exhausted": "set aside",
    "_sampling_table": "sampling table",
}


class FreeForwardRunner(ModelRunner):
    """A runner whose decode forward costs nothing: fixed logits, cache lengths advanced."""

    def __init__(self, cfg: RunnerConfig) -> None:
        super().__init__(cfg)
        generator = torch.Generator().manual_seed(0)
        self.fixed_logits = torch.randn(self.cache.num_slots, self.model.config.vocab_size, generator=generator)

    def decode(self, slots: list[int], tokens: list[int], positions: list[int], *args: Any, **kwargs: Any):
        for slot, position in zip(slots, positions):
            self.cache.lengths[slot] = position + 1
        return self.fixed_logits[: len(slots)]


class TimedEngine(Engine):
    """The engine with each part of a decode step timed (``seconds[part]``)."""

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__(runner)
        self.seconds: collections.Counter[str] = collections.Counter()
        for name in (*PARTS, "_decode_step"):
            setattr(self, name, self._timed(name, getattr(self, name)))
        self.runner.decode = self._timed("forward", runner.decode)

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start

        return timed


def timed_sample(engine: TimedEngine) -> Callable[[], None]:
    """Time the decode step's sampling ops into ``engine.seconds['sampling']``; returns the undo."""
    original = decode_step.sample
    decode_step.sample = engine._timed("sampling", original)

    def undo() -> None:
        decode_step.sample = original

    return undo


def measure(batch: int, new_tokens: int, repeats: int) -> dict[str, float]:
    """Microseconds a step of each part (fastest of ``repeats`` runs) at ``batch`` rows."""
    from areal_tasks.models import build_tiny_model

    runner = FreeForwardRunner(
        RunnerConfig(
            str(build_tiny_model("qwen2")), device="cpu", max_running_requests=batch, context_length=new_tokens + 16
        )
    )
    engine = TimedEngine(runner)
    undo = timed_sample(engine)
    engine.start()
    try:
        prompts = [[5 + i % 97, 7, 9, 11] for i in range(batch)]
        greedy = {"temperature": 0.0}
        run_engine(engine, prompts, 4, greedy)  # warm-up
        best: dict[str, float] = {}
        for _ in range(repeats):
            engine.seconds.clear()
            before = engine.stats().decode_steps_total
            run_engine(engine, prompts, new_tokens, greedy)
            steps = engine.stats().decode_steps_total - before
            us = {part: 1e6 * s / steps for part, s in engine.seconds.items()}
            us["launch"] = us.pop("_launch") - us.get("forward", 0.0)
            for name, label in PARTS.items():
                if name in us:
                    us[label] = us.pop(name)
            us["engine total"] = us.pop("_decode_step") - us.get("forward", 0.0) - us.get("sampling", 0.0)
            best = {k: min(v, best.get(k, v)) for k, v in us.items()}
        return best
    finally:
        undo()
        engine.shutdown()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="64,256,1024", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the sampling ops' CPU work)")
    parser.add_argument("--out", type=Path, default=RESULTS / "engine_host_overhead_cpu.json")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    columns = ["engine total", "launch", "collect", "retire", "set aside", "sampling table", "sampling", "forward"]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        us = measure(batch, args.new_tokens, args.repeats)
        rows.append({"batch": batch, **{c: round(us.get(c, 0.0), 1) for c in columns}})
    print(f"\nengine host work a decode step, microseconds (fastest of {args.repeats}; forward free, greedy)")
    print("| batch | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for row in rows:
        print(f"| {row['batch']} | " + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")
    meta = {
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "torch_threads": args.threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
