"""Inference throughput: the embedded server's engine vs ``transformers.generate``.

A randomly initialised Qwen2 model of the chosen shape (``qwen2.5-0.5b``: hidden 896, 24 layers, 14
heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings; ``tiny``: the tiny-model kit's
qwen2 for a CPU run) serves ``--concurrency`` requests of ``--prompt-len`` random prompt tokens and
``--new-tokens`` generated tokens each (greedy, EOS ignored), all submitted at once to the engine
(in process, no HTTP; ``--http`` adds a run through ``areal serve`` with concurrent ``/generate``
calls). Throughput is generated tokens / wall time from submission to the last answer (prefill
included). The baseline is ``generate`` on the same model, dtype and device at each of
``--hf-batches`` (equal-length prompts, no padding, static cache on CUDA not forced).

Every timed run is repeated ``--repeats`` times and the fastest kept (shared machines are noisy).

Greedy parity: the engine's outputs for the first ``--check`` prompts are compared with ``generate``
at batch 1; the table reports how many are token-identical and the mean fraction of matching
leading tokens (bf16 batched kernels may flip near-ties of a random model; fp32 on CPU matches),
and, for each output that differs, the reference's logit gap between its token and the engine's at
the first difference: a gap near the dtype's rounding is a near-tie, a large one a real error.

Prints a table and writes JSON (``benchmarks/results/inference_throughput_<device>.json`` by default).

Usage::

    python benchmarks/inference_throughput.py --preset tiny                    # CPU, about a minute
    python benchmarks/inference_throughput.py --preset qwen2.5-0.5b            # one GPU
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
from inference_http import run_http  # benchmarks/ is the script's directory, first on sys.path
from inference_profile import decode_kernels, forward_and_sampling_times, profile_engine
from inference_reference import divergence_gaps, hf_generate, parity
from inference_runs import timed_engine_run, warm_up

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
#: comparison runs against the default server (``--variants``): label and RunnerConfig overrides.
VARIANTS = {
    "pointwise": ("pointwise compiled", {"compile_scope": "pointwise"}, {}),
    "sdpa": ("SDPA decode attention", {"decode_attention": "sdpa"}, {}),
    "prefill32k": ("max_prefill_tokens 32768", {}, {"max_prefill_tokens": 32768}),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=("tiny", *PRESETS), default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", help="auto: float32 on CPU, bfloat16 on CUDA")
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--hf-batches", default="256,1", help="comma-separated generate batch sizes")
    parser.add_argument("--check", type=int, default=8, help="prompts compared with generate at batch 1")
    parser.add_argument("--sampling", action="store_true", help="also run temperature 1, top_p 0.9")
    parser.add_argument("--http", action="store_true", help="also measure through areal serve over HTTP")
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
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per system; the fastest is kept")
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
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := sorted(set(variants) - set(VARIANTS)):
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    try:
        hf_batches = [int(b) for b in args.hf_batches.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--hf-batches takes comma-separated batch sizes, got {args.hf_batches!r}")
    if any(b < 1 for b in hf_batches):
        parser.error(
            f"--hf-batches sizes must be at least 1 (leave it empty to skip generate), got {args.hf_batches!r}"
        )
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
    rows: list[dict] = []

    def add(row: dict) -> None:  # printed as soon as measured, so a later failure keeps the figure
        rows.append(row)
        print(f"measured: {row['system']}, batch {row['batch']}: {row['tokens_per_s']:,.0f} tokens/s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model_dir(args.preset, Path(tmp))
        prompts = make_prompts(args.concurrency, args.prompt_len)
        runner = build_runner(
            RunnerConfig(
                str(model_dir),
                dtype=args.dtype,
                device=str(device),
                max_running_requests=args.concurrency,
                context_length=args.prompt_len + args.new_tokens + 8,
                torch_compile=not args.disable_torch_compile,
            )
        )
        dtype = runner.dtype
        cuda_graphs = bool(getattr(runner, "capture", False))
        compiled = bool(runner.compiled)
        engine = Engine(runner, max_prefill_tokens=args.max_prefill_tokens, prefix_cache=args.prefix_cache == "on")
        engine.start()
        try:
            warm_up(engine, prompts)
            seconds, outputs, anatomy = timed_engine_run(
                engine, prompts, args.new_tokens, {"temperature": 0.0}, args.repeats
            )
            add(
                {
                    "system": "embedded engine, greedy",
                    "batch": args.concurrency,
                    "seconds": seconds,
                    "tokens_per_s": args.concurrency * args.new_tokens / seconds,
                    **anatomy,
                }
            )
            if args.sampling:
                seconds, _, anatomy = timed_engine_run(
                    engine, prompts, args.new_tokens, {"temperature": 1.0, "top_p": 0.9}, args.repeats
                )
                add(
                    {
                        "system": "embedded engine, T=1 top_p=0.9",
                        "batch": args.concurrency,
                        "seconds": seconds,
                        "tokens_per_s": args.concurrency * args.new_tokens / seconds,
                        **anatomy,
                    }
                )
        finally:
            engine.shutdown()
        # the same engine reading each step back before launching the next (SGLang's
        # --disable-overlap-schedule), to show what the overlap buys
        engine = Engine(
            runner, max_prefill_tokens=args.max_prefill_tokens, overlap=False, prefix_cache=args.prefix_cache == "on"
        )
        engine.start()
        try:
            warm_up(engine, prompts)
            seconds, _, anatomy = timed_engine_run(engine, prompts, args.new_tokens, {"temperature": 0.0}, args.repeats)
            add(
                {
                    "system": "embedded engine, greedy, no overlap",
                    "batch": args.concurrency,
                    "seconds": seconds,
                    "tokens_per_s": args.concurrency * args.new_tokens / seconds,
                    **anatomy,
                }
            )
        finally:
            engine.shutdown()
        profiled = (
            profile_engine(runner, prompts, args.profile, args.max_prefill_tokens, args.prefix_cache == "on")
            if args.profile
            else None
        )
        step_parts = forward_and_sampling_times(runner, args.concurrency) if device.type == "cuda" else None
        kernels = {"default": decode_kernels(runner, args.concurrency)} if device.type == "cuda" else None
        del engine, runner
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for variant in variants if device.type == "cuda" and compiled else ():
            label, overrides, engine_overrides = VARIANTS[variant]
            runner = build_runner(
                RunnerConfig(
                    str(model_dir),
                    dtype=args.dtype,
                    device=str(device),
                    max_running_requests=args.concurrency,
                    context_length=args.prompt_len + args.new_tokens + 8,
                    **overrides,
                )
            )
            engine = Engine(
                runner,
                **{
                    "max_prefill_tokens": args.max_prefill_tokens,
                    "prefix_cache": args.prefix_cache == "on",
                    **engine_overrides,
                },
            )
            engine.start()
            try:
                warm_up(engine, prompts)
                seconds, other_outputs, anatomy = timed_engine_run(
                    engine, prompts, args.new_tokens, {"temperature": 0.0}, args.repeats
                )
                add(
                    {
                        "system": f"embedded engine, greedy, {label}",
                        "batch": args.concurrency,
                        "seconds": seconds,
                        "tokens_per_s": args.concurrency * args.new_tokens / seconds,
                        **anatomy,
                    }
                )
            finally:
                engine.shutdown()
            same = sum(a == b for a, b in zip(other_outputs, outputs))
            print(f"{label} vs the default server: {same}/{len(outputs)} greedy outputs identical")
            step_parts += [
                {**row, "what": f"{row['what']} ({variant})"}
                for row in forward_and_sampling_times(runner, args.concurrency)
                if row["what"].startswith("decode forward")
            ]
            kernels[variant] = decode_kernels(runner, args.concurrency)
            del engine, runner
            torch.cuda.empty_cache()
        if args.http:
            seconds = min(run_http(model_dir, args, prompts) for _ in range(args.repeats))
            add(
                {
                    "system": "areal serve over HTTP, greedy",
                    "batch": args.concurrency,
                    "seconds": seconds,
                    "tokens_per_s": args.concurrency * args.new_tokens / seconds,
                }
            )
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        checked = min(args.check, len(prompts))
        references = [hf_generate(model, [p], args.new_tokens)[1][0] for p in prompts[:checked]]
        identical, prefix = parity(outputs[:checked], references)
        gaps = divergence_gaps(model, prompts[:checked], outputs[:checked], references)
        for batch in hf_batches:
            hf_generate(model, prompts[: min(batch, 2)], 4)  # warm-up
            seconds = min(hf_generate(model, prompts[:batch], args.new_tokens)[0] for _ in range(args.repeats))
            add(
                {
                    "system": "transformers generate",
                    "batch": batch,
                    "seconds": seconds,
                    "tokens_per_s": batch * args.new_tokens / seconds,
                }
            )
    report = {
        "preset": args.preset,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "concurrency": args.concurrency,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "cuda_graphs": cuda_graphs,
        "torch_compile": compiled,
        "greedy_parity": {
            "checked": checked,
            "identical": identical,
            "mean_matching_prefix": prefix,
            "divergence_logit_gaps": gaps,
        },
        "rows": rows,
        "profile": profiled,
        "step_parts": step_parts,
        "decode_kernels": kernels,
    }
    print(
        f"\n{args.preset} on {report['gpu'] or report['cpu']} ({report['dtype']}), "
        f"{args.concurrency} x ({args.prompt_len} prompt + {args.new_tokens} new tokens)"
    )
    print(f"{'system':<38} {'batch':>6} {'seconds':>9} {'tokens/s':>12} {'ms/step':>8} {'wait ms':>8}")
    for row in rows:
        step = f"{row['ms_per_step']:>8.2f} {row['wait_ms_per_step']:>8.2f}" if "ms_per_step" in row else ""
        print(f"{row['system']:<38} {row['batch']:>6} {row['seconds']:>9.2f} {row['tokens_per_s']:>12,.0f} {step}")
    print("(ms/step: host time of a decode step in the engine; wait ms: the part spent waiting for the device)")
    print(f"greedy parity vs generate (batch 1): {identical}/{checked} identical, mean matching prefix {prefix:.1%}")
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
