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
* ``collect``: the read-back of the step before and the per-row finish checks (``_collect``), less
  the wait for the device (``wait``);
* ``retire``, ``set aside``, ``sampling table``: the rest of the per-step bookkeeping;
* ``engine total``: the whole step less the runner's decode call, the sampling ops (which run
  on the device on a GPU) and the wait;
* ``runner``: the runner's decode call with its forward free: the step's inputs staged for the
  device. ``--runner graph`` runs the CUDA-graph runner's static steps (``cuda_graph.py``, uncaptured
  on the CPU, the static forward replaced by the fixed logits), whose staging a GPU step pays;
  ``--runner eager`` (the default) the eager runner's (its cache-length bookkeeping only);
* ``step``: the whole step, wall time.

``--runner real`` runs the server's own runner (``build_runner``: CUDA graphs on a GPU) with its real
forward over ``--preset`` (``tiny``, or ``qwen2.5-0.5b``'s shape with random weights) on ``--device``:
on a GPU its columns say where a host-bound step's time goes (``runner`` and ``sampling`` are then
the host time to queue the forward and the sampling ops; a part that waits for the device shows
as a large one).

Every prompt of a batch is submitted at once and decodes ``--new-tokens`` greedy tokens (EOS
ignored), so every step has the full batch. Each batch runs ``--repeats`` times; each part reports
the fastest run's microseconds a step. Prints a table and writes JSON
(``benchmarks/results/engine_host_overhead_cpu.json`` by default; ``_cpu_graph.json``,
``_real_cuda.json`` for the other runners).

Usage::

    python benchmarks/engine_host_overhead.py                    # batches 64, 256, 1024; ~1 min
    python benchmarks/engine_host_overhead.py --batches 256 --repeats 5
    python benchmarks/engine_host_overhead.py --runner graph       # the CUDA-graph runner's staging
    python benchmarks/engine_host_overhead.py --runner real --device cuda --preset qwen2.5-0.5b --prompt-len 128
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from inference_runs import run_engine  # benchmarks/, the script's directory
from inference_throughput import build_model_dir

from areal_tasks.inference.server import decode_step
from areal_tasks.inference.server.cuda_graph import GraphModelRunner, build_runner
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
        self._last_decode = (slots, None)  # what decode_again decodes again
        return self.fixed_logits[: len(slots)]


class FreeForwardGraphRunner(GraphModelRunner):
    """The CUDA-graph runner, uncaptured, whose static forward costs nothing (fixed logits): its
    decode calls stage their inputs into the device buffers as on a GPU."""

    def __init__(self, cfg: RunnerConfig) -> None:
        super().__init__(cfg, capture=False)
        generator = torch.Generator().manual_seed(0)
        self.fixed_logits = torch.randn(self.buckets[-1], self.model.config.vocab_size, generator=generator)

    def _static_forward(self, batch: int, kv_len: int) -> torch.Tensor:
        return self.fixed_logits[:batch]


RUNNERS: dict[str, Callable[[RunnerConfig], ModelRunner]] = {
    "eager": FreeForwardRunner,
    "graph": FreeForwardGraphRunner,
    "real": build_runner,
}


class TimedEngine(Engine):
    """The engine with each part of a decode step timed (``seconds[part]``)."""

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__(runner)
        self.seconds: collections.Counter[str] = collections.Counter()
        for name in (*PARTS, "_decode_step"):
            setattr(self, name, self._timed(name, getattr(self, name)))
        self._in_runner = False
        for name in ("decode", "decode_again"):  # the eager runner's decode_again calls its decode
            if hasattr(runner, name):  # (code before decode_again has none)
                setattr(self.runner, name, self._timed_runner(getattr(runner, name)))

    def _timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - start

        return timed

    def _timed_runner(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed into ``seconds['runner']``, once however the runner's calls nest."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._in_runner:
                return fn(*args, **kwargs)
            self._in_runner, start = True, time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._in_runner = False
                self.seconds["runner"] += time.perf_counter() - start

        return timed


def timed_sample(engine: TimedEngine) -> Callable[[], None]:
    """Time the decode step's sampling ops into ``engine.seconds['sampling']``; returns the undo."""
    original = decode_step.sample
    decode_step.sample = engine._timed("sampling", original)

    def undo() -> None:
        decode_step.sample = original

    return undo


def measure(
    batch: int, new_tokens: int, repeats: int, runner_kind: str, model_dir: str, device: str, prompt_len: int
) -> dict[str, float]:
    """Microseconds a step of each part (fastest of ``repeats`` runs) at ``batch`` rows, and the
    fastest run's generated tokens a second."""
    runner = RUNNERS[runner_kind](
        RunnerConfig(model_dir, device=device, max_running_requests=batch, context_length=prompt_len + new_tokens + 16)
    )
    engine = TimedEngine(runner)
    undo = timed_sample(engine)
    engine.start()
    try:
        prompts = [[5 + (i + j) % 97 for j in range(prompt_len)] for i in range(batch)]
        greedy = {"temperature": 0.0}
        run_engine(engine, prompts, 4, greedy)  # warm-up
        best: dict[str, float] = {}
        for _ in range(repeats):
            engine.seconds.clear()
            before = engine.stats()
            seconds, _ = run_engine(engine, prompts, new_tokens, greedy)
            after = engine.stats()
            steps = after.decode_steps_total - before.decode_steps_total
            us = {part: 1e6 * s / steps for part, s in engine.seconds.items()}
            us["wait"] = 1e6 * (after.decode_wait_seconds_total - before.decode_wait_seconds_total) / steps
            us["launch"] = us.pop("_launch") - us.get("runner", 0.0)
            for name, label in PARTS.items():
                if name in us:
                    us[label] = us.pop(name)
            us["collect"] -= us["wait"]
            us["step"] = us.pop("_decode_step")
            us["engine total"] = us["step"] - us.get("runner", 0.0) - us.get("sampling", 0.0) - us["wait"]
            us["tokens/s"] = -batch * new_tokens / seconds  # negated: the min keeps the fastest run
            best = {k: min(v, best.get(k, v)) for k, v in us.items()}
        best["tokens/s"] = -best["tokens/s"]
        return best
    finally:
        undo()
        engine.shutdown()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="64,256,1024", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runner", choices=tuple(RUNNERS), default="eager", help="the runner whose staging is timed")
    parser.add_argument("--preset", default="tiny", help="the model: tiny, or qwen2.5-0.5b's shape (--runner real)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompt-len", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the sampling ops' CPU work)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: results/engine_host_overhead_cpu.json (_graph.json for --runner graph)",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.runner != "real" and (args.preset != "tiny" or args.device != "cpu"):
        raise SystemExit("--preset and --device choose the model and device of --runner real only")
    with tempfile.TemporaryDirectory(prefix="engine_host_") as scratch:
        # the kit's tiny Qwen2, or a random model of the preset's shape (written under scratch)
        path = str(build_model_dir(args.preset, Path(scratch)))
        rows = [
            {
                "batch": batch,
                **measure(batch, args.new_tokens, args.repeats, args.runner, path, args.device, args.prompt_len),
            }
            for batch in (int(b) for b in args.batches.split(","))
        ]
    columns = ["engine total", "launch", "collect", "retire", "set aside", "sampling table", "sampling", "runner"]
    columns += ["wait", "step", "tokens/s"]
    rows = [{"batch": row["batch"], **{c: round(row.get(c, 0.0), 1) for c in columns}} for row in rows]
    forward = "real forward" if args.runner == "real" else "forward free"
    print(
        f"\nengine host work a decode step, microseconds (fastest of {args.repeats}; {args.runner} runner, "
        f"{forward}, {args.preset} on {args.device}, greedy)"
    )
    print("| batch | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for row in rows:
        print(f"| {row['batch']} | " + " | ".join(f"{row[c]:.1f}" for c in columns) + " |")
    meta = {
        "new_tokens": args.new_tokens,
        "prompt_len": args.prompt_len,
        "repeats": args.repeats,
        "runner": args.runner,
        "preset": args.preset,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "torch_threads": args.threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
    }
    if args.out is None:
        kind = args.device.split(":")[0]
        name = {"eager": "cpu", "graph": "cpu_graph", "real": f"real_{kind}"}[args.runner]
        args.out = RESULTS / f"engine_host_overhead_{name}.json"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"config": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
