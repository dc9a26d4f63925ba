"""Inference throughput: the embedded server's engine, ``areal serve`` over HTTP and ``transformers.generate``.

A randomly initialised Qwen2 model of the chosen shape (``qwen2.5-0.5b``: hidden 896, 24 layers, 14
heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings; ``tiny``: the tiny-model kit's
qwen2 for a CPU run) generates for requests of ``--prompt-len`` random prompt tokens and
``--new-tokens`` generated tokens each (EOS ignored, so every count is exact), all submitted at
once. Throughput is generated tokens / wall time from submission to the last answer (prefill
included).

One run measures a table whose rows are workloads and whose columns are the engine (in process, no
HTTP) and, with ``--http``, ``areal serve`` over HTTP (concurrent ``/generate`` calls through the
RL client's transport, from a process whose start-up heap is frozen as the RL rollout process's
is) with the HTTP / engine ratio:

* each sampling mode of ``--modes`` (greedy; T=1; T=1 top_p 0.9; T=1 top_k 50; all four with
  ``--sampling``, greedy alone without) at each of the ``--concurrency`` list's sizes;
* GRPO groups (with the top_p mode, ``--groups N``): at the first concurrency, its sequences as one
  ``n=N`` request a prompt (one prefill shared by the N samples) against N separate requests a
  prompt (each prefilled on its own, the prefix cache being off by default);
* the greedy engine without the overlap of host and device (SGLang's --disable-overlap-schedule), at
  the first concurrency;
* on CUDA, ``--variants``: the greedy engine on runners with one setting changed, at the first
  concurrency, and the parts and kernels of a decode step (``step_parts``, ``decode_kernels``);
* ``transformers generate`` (greedy) at each of ``--hf-batches`` (equal-length prompts, no padding).

The runner is built once for the largest concurrency (its CUDA-graph batch buckets cover every
size) and ``areal serve`` started once likewise; every row reuses them. Every timed run follows a
4-token warm-up of the same requests, is repeated ``--repeats`` times and the fastest is kept
(shared machines are noisy).

Greedy parity: the engine's greedy outputs for the first ``--check`` prompts are compared with
``generate`` at batch 1; the report gives how many are token-identical and the mean fraction of
matching leading tokens (bf16 batched kernels may flip near-ties of a random model; fp32 on CPU
matches), and, for each output that differs, the reference's logit gap between its token and the
engine's at the first difference: a gap near the dtype's rounding is a near-tie, a large one a real
error.

Every engine and HTTP row also says where its wall time went, from the engine's counters (over
HTTP, the server's ``/metrics`` before and after): decode steps and their host time, admission
prefills and theirs, and the rest (the engine idle: over HTTP, requests still arriving or answers
leaving). A burst that reached the server's engine in several waves shows as more prefills and more
decode steps than the engine row of the same workload.

Prints each figure as it is measured, then the tables, and writes JSON
(``benchmarks/results/inference_throughput_<device>.json`` by default).

Usage::

    python benchmarks/inference_throughput.py --preset tiny                    # CPU, greedy, a few minutes
    python benchmarks/inference_throughput.py --preset tiny --hf-batches= --check 0 --http --sampling \\
        --concurrency 64,128 --new-tokens 64 --repeats 1                        # CPU, the whole table
    python benchmarks/inference_throughput.py --preset qwen2.5-0.5b --concurrency 256,512,1024 --http --sampling
    python benchmarks/inference_throughput.py --preset tiny --profile 32       # where a step's time goes
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import shutil
import tempfile
from pathlib import Path

import torch
from inference_http import (
    HttpClient,
    add_server_arguments,
    serving,
)  # benchmarks/ is the script's directory, first on sys.path
from inference_profile import decode_kernels, forward_and_sampling_times, profile_engine
from inference_reference import divergence_gaps, hf_generate, parity
from inference_report import Rows, print_table
from inference_runs import timed_engine_run, warm_up
from inference_variants import VARIANTS, run_variants
from inference_workloads import GROUP_MODE, MODES, group_pair, matrix, parse_modes, parse_sizes

from areal_tasks.gc_heap import freeze_startup_heap

logger = logging.getLogger(__name__)

RESULTS = Path(__file__).resolve().parent / "results"

PRESETS = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
    },
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_model_dir(preset: str, root: Path) -> Path:
    """The model directory: the tiny kit's qwen2, or a random Qwen2 of the preset's shape (fp32 on disk)
    with the tiny kit's tokenizer (prompts use ids below its 1024-token vocabulary)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from areal_tasks.models import build_tiny_model

    tiny = build_tiny_model("qwen2")
    if preset == "tiny":
        return tiny
    path = root / preset
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**PRESETS[preset]), dtype=torch.float32)
    model.save_pretrained(str(path))
    for name in _TOKENIZER_FILES:
        if (tiny / name).exists():
            shutil.copy(tiny / name, path / name)
    return path


def make_prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, 1000, (count, length), generator=gen).tolist()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("tiny", *PRESETS), default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument(
        "--concurrency",
        default="256",
        help="comma-separated sequences in flight, one row of each mode at each (the runner and the "
        "server are built for the largest; groups, no-overlap and variants run at the first)",
    )
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--hf-batches", default="256,1", help="comma-separated generate batch sizes; empty: none")
    parser.add_argument("--check", type=int, default=8, help="prompts compared with generate at batch 1")
    parser.add_argument(
        "--sampling", action="store_true", help="also the sampled modes (the default of --modes: greedy without it)"
    )
    parser.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated sampling modes, of: {', '.join(f'{k} ({v[0]})' for k, v in MODES.items())} "
        "(default: all with --sampling, greedy without)",
    )
    parser.add_argument(
        "--groups",
        type=int,
        default=8,
        metavar="N",
        help=f"GRPO rows when the {GROUP_MODE} mode runs: n=N samples a request against N requests a "
        "prompt, at the first concurrency; 0 skips them",
    )
    parser.add_argument("--http", action="store_true", help="also measure through areal serve over HTTP")
    add_server_arguments(parser)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument(
        "--disable-torch-compile",
        action="store_true",
        help="keep the server's norms and MLPs eager (compiled by default on CUDA)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="on CUDA, comma-separated comparison runs of the greedy engine against the default "
        f"server: {', '.join(f'{k} ({v[0]})' for k, v in VARIANTS.items())}; empty for none",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=8192,
        help="prompt tokens prefilled per engine iteration at most (the server's default)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per row; the fastest is kept")
    parser.add_argument(
        "--prefix-cache",
        choices=("on", "off"),
        default="off",
        help="the engine's prefix cache (off: the server's default; docs/inference.md)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile one greedy run of N new tokens (host: cProfile, device: torch profiler)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.variant_list = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := sorted(set(args.variant_list) - set(VARIANTS)):
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    try:
        args.hf_batch_list = parse_sizes(args.hf_batches, "--hf-batches")
        args.levels = parse_sizes(args.concurrency, "--concurrency")
        args.mode_list = parse_modes(args.modes, args.sampling)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.levels:
        parser.error("--concurrency names no size; give one or more, e.g. 256,512,1024")
    if args.repeats < 1 or args.groups < 0:
        parser.error(f"--repeats must be at least 1 and --groups at least 0, got {args.repeats} and {args.groups}")
    if args.groups and GROUP_MODE in args.mode_list and args.groups > args.levels[0]:
        parser.error(
            f"--groups {args.groups} is larger than the first --concurrency ({args.levels[0]}): lower --groups "
            "or put a larger size first"
        )
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from areal_tasks.quiet_logs import quiet_third_party_loggers

    quiet_third_party_loggers()  # httpx logs every request at INFO: thousands of lines and client time
    if args.num_threads:
        torch.set_num_threads(args.num_threads)

    from transformers import AutoModelForCausalLM

    from areal_tasks.inference.server.cuda_graph import build_runner
    from areal_tasks.inference.server.engine import Engine
    from areal_tasks.inference.server.model_runner import RunnerConfig, resolve_device

    device = resolve_device(args.device)
    first, largest = args.levels[0], max(args.levels)
    prefix_cache = args.prefix_cache == "on"
    rows = Rows(args.new_tokens)
    step_parts = kernels = profiled = None
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model_dir(args.preset, Path(tmp))
        prompts = make_prompts(largest, args.prompt_len)
        workloads = matrix(args.mode_list, args.levels, prompts)
        if args.groups and GROUP_MODE in args.mode_list:
            workloads += group_pair(first, args.groups, prompts)
        runner = build_runner(
            RunnerConfig(
                str(model_dir),
                dtype=args.dtype,
                device=str(device),
                max_running_requests=largest,
                context_length=args.prompt_len + args.new_tokens + 8,
                torch_compile=not args.disable_torch_compile,
            )
        )
        dtype = runner.dtype
        cuda_graphs = bool(getattr(runner, "capture", False))
        compiled = bool(runner.compiled)
        greedy_outputs: list[list[int]] = []  # the greedy engine's, at the first concurrency
        engine = Engine(runner, max_prefill_tokens=args.max_prefill_tokens, prefix_cache=prefix_cache)
        engine.start()
        try:
            for work in workloads:
                warm_up(engine, work.prompts, work.sampling, work.n)
                seconds, outputs, anatomy = timed_engine_run(
                    engine, work.prompts, args.new_tokens, work.sampling, args.repeats, work.n
                )
                rows.workload(work, "engine", seconds, anatomy)
                if work.mode == "greedy" and work.kind == "requests" and work.sequences == first:
                    greedy_outputs = outputs
        finally:
            engine.shutdown()
        # the same engine reading each step back before launching the next (SGLang's
        # --disable-overlap-schedule), to show what the overlap buys
        engine = Engine(runner, max_prefill_tokens=args.max_prefill_tokens, overlap=False, prefix_cache=prefix_cache)
        engine.start()
        try:
            warm_up(engine, prompts[:first])
            seconds, outputs, anatomy = timed_engine_run(
                engine, prompts[:first], args.new_tokens, {"temperature": 0.0}, args.repeats
            )
            rows.measured(
                "embedded engine, greedy, no overlap", first, seconds, mode="greedy", path="engine", **anatomy
            )
            greedy_outputs = greedy_outputs or outputs
        finally:
            engine.shutdown()
        if args.profile:
            profiled = profile_engine(runner, prompts[:first], args.profile, args.max_prefill_tokens, prefix_cache)
        if device.type == "cuda":
            step_parts = forward_and_sampling_times(runner, first)
            kernels = {"default": decode_kernels(runner, first)}
        del engine, runner
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if device.type == "cuda" and compiled and args.variant_list:
            run_variants(
                args.variant_list,
                model_dir,
                str(device),
                args,
                prompts[:first],
                greedy_outputs,
                rows,
                step_parts,
                kernels,
            )
        if args.http:
            freeze_startup_heap()  # the client's side as RL's rollout process runs it (gc_heap.py)
            with (
                serving(model_dir, args, largest, args.max_prefill_tokens, prefix_cache) as (url, _),
                HttpClient(url, largest) as client,
            ):
                for work in workloads:
                    seconds, anatomy = client.timed(work.prompts, args.new_tokens, work.sampling, args.repeats, work.n)
                    rows.workload(work, "http", seconds, anatomy)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        checked = min(args.check, len(greedy_outputs))
        references = [hf_generate(model, [p], args.new_tokens)[1][0] for p in prompts[:checked]]
        identical, prefix = parity(greedy_outputs[:checked], references)
        gaps = divergence_gaps(model, prompts[:checked], greedy_outputs[:checked], references)
        for batch in args.hf_batch_list:
            batch_prompts = make_prompts(batch, args.prompt_len) if batch > len(prompts) else prompts[:batch]
            hf_generate(model, batch_prompts[:2], 4)  # warm-up
            seconds = min(hf_generate(model, batch_prompts, args.new_tokens)[0] for _ in range(args.repeats))
            rows.measured("transformers generate", batch, seconds, mode="greedy", path="transformers")
    report = {
        "preset": args.preset,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "concurrency": args.levels,
        "modes": args.mode_list,
        "groups": args.groups,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "cuda_graphs": cuda_graphs,
        "torch_compile": compiled,
        # areal serve's --switch-interval-us for the HTTP rows (None: the server's default)
        "server_switch_interval_us": args.server_switch_interval_us,
        "server_http_frontend": args.server_http_frontend,
        "greedy_parity": {
            "checked": checked,
            "identical": identical,
            "mean_matching_prefix": prefix,
            "divergence_logit_gaps": gaps,
        },
        "rows": rows.rows,
        "profile": profiled,
        "step_parts": step_parts,
        "decode_kernels": kernels,
    }
    print_table(
        rows.rows,
        f"{args.preset} on {report['gpu'] or report['cpu']} ({report['dtype']}), "
        f"{args.prompt_len} prompt + {args.new_tokens} new tokens a sequence",
    )
    if checked:
        print(
            f"greedy parity vs generate (batch 1): {identical}/{checked} identical, mean matching prefix {prefix:.1%}"
        )
    else:
        print("greedy parity vs generate: not checked (--check 0)")
    if gaps:
        print(
            "  at each first divergence, generate's logit gap to the engine's token: "
            + ", ".join(f"{g:.4f}" for g in gaps)
        )
    out = args.out or RESULTS / f"inference_throughput_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
