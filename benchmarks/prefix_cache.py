"""The embedded server's prefix cache on a GRPO-like load: prefill tokens saved and wall time, on vs off.

    python benchmarks/prefix_cache.py [--prompts 8] [--samples 8] [--prompt-len 64] [--new-tokens 32]
        [--turn-tokens 16] [--hidden-size 256] [--layers 4] [--slots 64] [--threads 1] [--device cpu]
        [--repeats 3] [--out benchmarks/results/prefix_cache.json]

Builds a tiny Qwen2 of ``--hidden-size`` x ``--layers`` (random weights, the kit's tokenizer) and
runs two engines over it in this process, one with the prefix cache and one without
(``Engine(prefix_cache=False)``, ``areal serve``'s ``ServerConfig.prefix_cache=False``). Each gets
the same load, as GRPO's rollout sends it: ``--prompts`` prompts of ``--prompt-len`` random tokens,
each sent as ``--samples`` separate requests (sampled, seeded per sample, ``--new-tokens`` each),
all submitted at once (``turn 1``); then every sample's second turn (its prompt, its output and
``--turn-tokens`` new tokens) as another wave once all first turns are done (``turn 2``: the
cache keeps at most ``--slots`` finished sequences, the most recent); then, from an empty cache,
two-turn ``episodes``: each sample sends its second turn as soon as its first ends, as an agent
does. Per phase it reports the prompt
positions admitted, those prefilled and those reused (the engine's ``prompt_tokens_total`` and
``cached_tokens_total``), the wall time from the first submit to the last answer (the median of
``--repeats`` runs of each engine, alternating), and whether both
engines gave identical output ids (seeded sampling; a flip at a near-tie of float rounding would
show here). Prints a table and writes ``benchmarks/results/prefix_cache.json``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import platform
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "prefix_cache.json"


def _engine(model: Path, args: argparse.Namespace, prefix_cache: bool) -> Any:
    from areal_tasks.inference.server.cuda_graph import build_runner
    from areal_tasks.inference.server.engine import Engine
    from areal_tasks.inference.server.model_runner import RunnerConfig

    cfg = RunnerConfig(
        str(model), device=args.device, max_running_requests=args.slots, context_length=args.context_length
    )
    engine = Engine(build_runner(cfg), prefix_cache=prefix_cache)
    engine.start()
    return engine


def _episodes(
    engine: Any, prompts: list[list[int]], args: argparse.Namespace, seed: int, follow: list[list[int]] | None = None
) -> dict[str, Any]:
    """Submit one request per prompt (separate requests, back to back) and wait for all. With
    ``follow``, each finished request sends its second turn at once (from its ``on_finish``): its
    prompt, its output and ``follow[i]``."""
    from areal_tasks.inference.server.request import Sequence, SequenceGroup
    from areal_tasks.inference.server.sampling import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    turns = 1 if follow is None else 2
    futures = {(i, t): concurrent.futures.Future() for i in range(len(prompts)) for t in range(turns)}
    positions = [0]

    def request(i: int, turn: int, prompt: list[int]) -> Sequence:
        positions[0] += len(prompt)

        def finished(seq: Sequence) -> None:
            if turn + 1 < turns and follow is not None:
                engine.submit([request(i, turn + 1, prompt + seq.output_ids + follow[i])])
            futures[(i, turn)].set_result(seq)

        return Sequence(
            rid=f"e{seed}-{i}-{turn}",
            group=SequenceGroup(prompt_ids=list(prompt)),
            params=replace(params, sampling_seed=seed * 100_000 + 10 * i + turn),
            on_finish=finished,
            return_logprob=True,
        )

    before = engine.stats()
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):  # one request each, as the rollout's client sends them
        engine.submit([request(i, 0, prompt)])
    done = {key: f.result(timeout=600) for key, f in futures.items()}
    wall = time.perf_counter() - started
    after = engine.stats()
    return {
        "requests": len(done),
        "prompt_positions": positions[0],
        "prefilled": after.prompt_tokens_total - before.prompt_tokens_total,
        "cached": after.cached_tokens_total - before.cached_tokens_total,
        "wall_s": wall,
        "outputs": [done[key].output_ids for key in sorted(done)],
    }


def _median_run(waves: list[dict[str, Any]]) -> dict[str, Any]:
    """The first repeat's counts and outputs (the same in every repeat) with the median wall time."""
    return {**waves[0], "wall_s": statistics.median(w["wall_s"] for w in waves)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from areal_tasks.models import build_tiny_model

    torch.set_num_threads(args.threads)
    model = build_tiny_model("qwen2", hidden_size=args.hidden_size, num_hidden_layers=args.layers)
    rng = random.Random(0)
    stems = [[rng.randrange(10, 1000) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    turn1 = [stem for stem in stems for _ in range(args.samples)]
    extra = [[rng.randrange(10, 1000) for _ in range(args.turn_tokens)] for _ in turn1]
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {"off": [], "on": []}
    for _ in range(args.repeats):  # alternating, so both see the same machine noise
        for name, prefix_cache in (("off", False), ("on", True)):
            engine = _engine(model, args, prefix_cache)
            try:
                _episodes(engine, [[1, 2, 3]], args, seed=9)  # warm-up (first forwards allocate)
                engine.call(engine.prefiller.drop_cache).result(timeout=60)
                first = _episodes(engine, turn1, args, seed=1)
                turn2 = [p + out + more for p, out, more in zip(turn1, first["outputs"], extra)]
                second = _episodes(engine, turn2, args, seed=2)
                engine.call(engine.prefiller.drop_cache).result(timeout=60)
                both = _episodes(engine, turn1, args, seed=3, follow=extra)
            finally:
                engine.shutdown()
            runs[name].append({"turn 1": first, "turn 2": second, "episodes": both})
    rows = []
    for phase in ("turn 1", "turn 2", "episodes"):
        off, on = (_median_run([r[phase] for r in runs[name]]) for name in ("off", "on"))
        rows.append(
            {
                "phase": phase,
                "requests": on["requests"],
                "prompt_positions": on["prompt_positions"],
                "prefilled_off": off["prefilled"],
                "prefilled_on": on["prefilled"],
                "cached_on": on["cached"],
                "saved_fraction": 1 - on["prefilled"] / off["prefilled"] if off["prefilled"] else 0.0,
                "wall_s_off": off["wall_s"],
                "wall_s_on": on["wall_s"],
                "speedup": off["wall_s"] / on["wall_s"] if on["wall_s"] else 0.0,
                "identical_outputs": off["outputs"] == on["outputs"],
            }
        )
    return {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__},
        "rows": rows,
    }


def _table(report: dict[str, Any]) -> str:
    head = (
        f"{'phase':<7} {'reqs':>5} {'prompt pos':>10} {'prefill off':>11} {'prefill on':>10} {'cached':>7} "
        f"{'saved':>6} {'wall off s':>10} {'wall on s':>9} {'speedup':>7} {'same ids':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in report["rows"]:
        lines.append(
            f"{r['phase']:<7} {r['requests']:>5} {r['prompt_positions']:>10} {r['prefilled_off']:>11} "
            f"{r['prefilled_on']:>10} {r['cached_on']:>7} {r['saved_fraction']:>6.1%} {r['wall_s_off']:>10.3f} "
            f"{r['wall_s_on']:>9.3f} {r['speedup']:>6.2f}x {r['identical_outputs']!s:>8}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8, help="separate requests per prompt (a GRPO group)")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--turn-tokens", type=int, default=16, help="new tokens of each second turn")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=64, help="max_running_requests (KV slots)")
    parser.add_argument("--context-length", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each engine; wall times are medians")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    report = run(args)
    print(_table(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
