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
import asyncio
import json
import logging
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

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


def run_engine(engine, prompts: list[list[int]], new_tokens: int, sampling: dict) -> tuple[float, list[list[int]]]:
    """Submit every prompt at once; returns (seconds until the last answer, outputs)."""
    import concurrent.futures

    from areal_tasks.inference.server.request import Sequence, SequenceGroup
    from areal_tasks.inference.server.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, **sampling)
    futures, seqs = [], []
    for i, prompt in enumerate(prompts):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        seqs.append(
            Sequence(
                rid=f"b{i}",
                group=SequenceGroup(list(prompt)),
                params=params,
                on_finish=lambda s, f=fut: f.set_result(s),
            )
        )
        futures.append(fut)
    start = time.perf_counter()
    engine.submit(seqs)
    done = [f.result(timeout=3600) for f in futures]
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, [s.output_ids for s in done]


def warm_up(engine, prompts: list[list[int]]) -> None:
    """Every prompt for a few tokens: the timed runs then meet admission prefills of shapes the
    engine has run before, as a serving engine does after its first requests. A new shape's
    first-call cost (per-shape kernel selection) is measured on its own in ``step_parts``."""
    run_engine(engine, prompts, 4, {"temperature": 0.0})


def timed_engine_run(
    engine, prompts: list[list[int]], new_tokens: int, sampling: dict, repeats: int
) -> tuple[float, list[list[int]], dict]:
    """The fastest of ``repeats`` runs: (seconds, outputs, decode anatomy). The anatomy comes from
    the engine's decode counters over that run: steps, host milliseconds a step and the part of
    them the host waited for the device (near the whole step: device-bound; near zero: host-bound)."""
    best = None
    for _ in range(repeats):
        before = engine.stats()
        seconds, outputs = run_engine(engine, prompts, new_tokens, sampling)
        after = engine.stats()
        steps = after.decode_steps_total - before.decode_steps_total
        host = after.decode_seconds_total - before.decode_seconds_total
        waited = after.decode_wait_seconds_total - before.decode_wait_seconds_total
        anatomy = {
            "decode_steps": steps,
            "ms_per_step": 1e3 * host / max(steps, 1),
            "wait_ms_per_step": 1e3 * waited / max(steps, 1),
        }
        if best is None or seconds < best[0]:
            best = (seconds, outputs, anatomy)
    assert best is not None
    return best


def forward_and_sampling_times(runner, batch: int, iters: int = 20) -> list[dict]:
    """Outside any engine: host and device milliseconds of one decode forward of ``batch`` rows
    (a CUDA-graph replay where captured) at each KV length bucket, and of greedy and T=1/top-p
    sampling over its logits. Device times come from CUDA events around ``iters`` calls."""
    from profiling import kernel_table  # benchmarks/, the script's directory
    from torch.profiler import ProfilerActivity, profile

    from areal_tasks.inference.server.sampling import SamplingBatch, SamplingParams, sample

    def timed(fn) -> tuple[float, float]:
        fn()
        torch.cuda.synchronize(runner.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host_start = time.perf_counter()
        start.record()
        for _ in range(iters):
            fn()
        host = (time.perf_counter() - host_start) / iters
        end.record()
        end.synchronize()
        return 1e3 * host, start.elapsed_time(end) / iters

    rows = []
    slots, tokens = list(range(batch)), [5] * batch
    for kv_len in getattr(runner, "lengths", [runner.max_len]):
        positions = [min(kv_len, runner.max_len) - 1] * batch
        host, device = timed(lambda: runner.decode(slots, tokens, positions))
        rows.append({"what": f"decode forward, KV length {kv_len}", "host_ms": host, "device_ms": device})
    logits = runner.decode(slots, tokens, [0] * batch)
    for label, params in (
        ("greedy", SamplingParams(temperature=0.0)),
        ("T=1", SamplingParams(temperature=1.0)),
        ("T=1 top_p=0.9", SamplingParams(temperature=1.0, top_p=0.9)),
    ):

        def draw(params=params) -> None:
            sample(logits, SamplingBatch.build([params] * batch, [None] * batch, logits.device), runner.greedy)

        host, device = timed(draw)
        rows.append({"what": f"sampling, {label}", "host_ms": host, "device_ms": device})
    # a prefill batch of a shape the runner has not seen (27 ragged prompts), then the same again:
    # the first call pays any per-shape set-up (torch.compile specialisation, attention plans)
    prompts = [[5 + i] * (40 + i) for i in range(min(27, runner.cache.free_slots))]
    prefill_slots = [runner.cache.allocate() for _ in prompts]
    for label in ("first call", "second call"):
        torch.cuda.synchronize(runner.device)
        started = time.perf_counter()
        runner.prefill_batch(prefill_slots, prompts)
        torch.cuda.synchronize(runner.device)
        wall = 1e3 * (time.perf_counter() - started)
        rows.append(
            {"what": f"prefill, new shape ({len(prompts)} ragged), {label}", "host_ms": wall, "device_ms": None}
        )
    for slot in prefill_slots:
        runner.cache.release(slot)
    # admission prefills of equal-length prompts (the benchmark's): wall and device time of one call,
    # with the norms and MLPs compiled (the server's) and eager (torch.compile's force_eager stance)
    for count in sorted({min(64, runner.cache.free_slots), runner.cache.free_slots}):
        prompts = [[5] * 128] * count
        prefill_slots = [runner.cache.allocate() for _ in prompts]
        for stance in ("default", "force_eager"):
            with torch.compiler.set_stance(stance):
                runner.prefill_batch(prefill_slots, prompts)  # a first call of this shape sets it up
                torch.cuda.synchronize(runner.device)
                started = time.perf_counter()
                runner.prefill_batch(prefill_slots, prompts)
                torch.cuda.synchronize(runner.device)
                wall = 1e3 * (time.perf_counter() - started)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    runner.prefill_batch(prefill_slots, prompts)
                    torch.cuda.synchronize(runner.device)
            busy = sum(row["ms_per_call"] for row in kernel_table(prof.events(), 1, top=10_000))
            kind = "compiled" if stance == "default" else "eager modules"
            rows.append({"what": f"prefill, {count} x 128, {kind}", "host_ms": wall, "device_ms": busy})
        for slot in prefill_slots:
            runner.cache.release(slot)
    print(f"\none decode step's parts at batch {batch} (host: time to queue it; device: time to run it)")
    print(f"{'part':<44} {'host ms':>9} {'device ms':>10}")
    for row in rows:
        device = "" if row["device_ms"] is None else f"{row['device_ms']:>10.3f}"
        print(f"{row['what']:<44} {row['host_ms']:>9.3f} {device}")
    print("(a prefill's host ms is its wall time, synchronised; device ms: the sum of its kernels' times)")
    return rows


def decode_kernels(runner, batch: int, calls: int = 10) -> list[dict]:
    """The device kernels of one decode forward of ``batch`` rows at the first KV-length bucket (a
    CUDA-graph replay where captured), from the torch profiler over ``calls`` forwards."""
    from profiling import kernel_table, print_kernel_table  # benchmarks/, the script's directory
    from torch.profiler import ProfilerActivity, profile

    slots, tokens = list(range(batch)), [5] * batch
    kv_len = getattr(runner, "lengths", [runner.max_len])[0]
    positions = [min(kv_len, runner.max_len) - 1] * batch
    runner.decode(slots, tokens, positions)
    torch.cuda.synchronize(runner.device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            runner.decode(slots, tokens, positions)
        torch.cuda.synchronize(runner.device)
    rows = kernel_table(prof.events(), calls)
    print_kernel_table(f"kernels of one decode forward, batch {batch}, KV length {kv_len}", rows)
    return rows


def profile_engine(
    runner, prompts: list[list[int]], new_tokens: int, max_prefill_tokens: int, prefix_cache: bool = False
) -> dict:
    """One untimed greedy run on a fresh engine under two profilers: ``cProfile`` inside the engine's
    loop thread (where the host time of a decode step goes) and the torch profiler's device
    activity (which kernels run, and the GPU-busy fraction: the union of kernel intervals over the
    run's wall time). Prints both; returns ``{"wall_s", "gpu_busy_fraction", "host_top"}``."""
    import cProfile
    import io
    import pstats

    from profiling import busy_fraction, device_kernels  # benchmarks/, the script's directory
    from torch.profiler import ProfilerActivity, profile

    from areal_tasks.inference.server.engine import Engine

    engine = Engine(runner, max_prefill_tokens=max_prefill_tokens, prefix_cache=prefix_cache)
    host = cProfile.Profile()
    loop = engine._loop  # the thread's target is looked up at start(): profile the loop from inside
    engine._loop = lambda: host.runcall(loop)  # type: ignore[method-assign]
    on_gpu = runner.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    engine.start()
    try:
        run_engine(engine, prompts[:8], 4, {"temperature": 0.0})  # warm-up
        with profile(activities=activities) as prof:
            wall, _ = run_engine(engine, prompts, new_tokens, {"temperature": 0.0})
    finally:
        engine.shutdown()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(18)
    host_top = text.getvalue()
    print("host time in the engine loop (cProfile, by own time):")
    print(host_top)
    result: dict = {"wall_s": wall, "gpu_busy_fraction": None, "host_top": host_top}
    if on_gpu:
        events = prof.events()
        kernels = [(e.time_range.start, e.time_range.end) for e in device_kernels(events)]
        if kernels:
            start = min(a for a, _ in kernels)
            result["gpu_busy_fraction"] = busy_fraction(kernels, start, start + wall * 1e6)
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60))
        print(f"profiled run {wall:.2f} s, GPU busy {100 * (result['gpu_busy_fraction'] or 0):.1f} %")
    return result


def hf_generate(model, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=model.device)
    with torch.no_grad():
        if model.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(
            ids,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        if model.device.type == "cuda":
            torch.cuda.synchronize()
    return time.perf_counter() - start, out[:, ids.shape[1] :].tolist()


@torch.inference_mode()
def divergence_gaps(model, prompts: list[list[int]], got: list[list[int]], want: list[list[int]]) -> list[float]:
    """For each output that differs from ``generate``'s: at the first differing position, the
    reference model's logit of its own token minus its logit of the engine's token, given the shared
    prefix. A gap within the dtype's rounding (bf16: about 1e-2 at these logit sizes) is a near-tie
    that batched kernels may break either way, not a wrong token."""
    gaps = []
    for prompt, a, b in zip(prompts, got, want):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None:
            continue
        ids = torch.tensor([prompt + b[:first]], device=model.device)
        logits = model(input_ids=ids).logits[0, -1].float()
        gaps.append(float(logits[b[first]] - logits[a[first]]))
    return gaps


def parity(got: list[list[int]], want: list[list[int]]) -> tuple[int, float]:
    """(token-identical outputs, mean fraction of matching leading tokens)."""
    fractions = []
    for a, b in zip(got, want):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fractions.append(same / max(len(b), 1))
    return sum(f == 1.0 for f in fractions), sum(fractions) / max(len(fractions), 1)


async def _http_run(url: str, prompts: list[list[int]], new_tokens: int) -> float:
    """Every prompt as a concurrent ``/generate`` call through the RL client's own transport
    (sharded ``httpx`` pools, see ``areal_tasks/inference/client/transport.py``), after a warm-up
    of every prompt for 4 tokens on the same transport: the timed calls find their connections
    open, as the long-lived client of an RL run does, and the engine has seen the admission shapes.
    Returns the timed run's seconds."""
    from areal_tasks.inference.client.protocol import HttpCall
    from areal_tasks.inference.client.transport import HttpTransport

    transport = HttpTransport(max_connections=len(prompts))

    async def run(tokens: int) -> float:
        body = {"sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}}
        start = time.perf_counter()
        answers = await asyncio.gather(
            *(transport.send(url, HttpCall("POST", "/generate", {**body, "input_ids": p}), 3600.0) for p in prompts)
        )
        elapsed = time.perf_counter() - start
        if any(status != 200 for status, _ in answers):
            raise RuntimeError(f"/generate failed: {next(text for status, text in answers if status != 200)}")
        return elapsed

    try:
        await run(4)
        return await run(new_tokens)
    finally:
        await transport.aclose()


def run_http(model_dir: Path, args: argparse.Namespace, prompts: list[list[int]]) -> float:
    """Throughput through ``areal serve`` (started here on a free port, stopped by PID)."""
    import os
    import signal
    import socket

    import httpx

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        sys.executable,
        "-m",
        "areal_tasks.cli",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--dtype",
        args.dtype,
        "--device",
        args.device,
        "--max-running-requests",
        str(args.concurrency),
        "--context-length",
        str(args.prompt_len + args.new_tokens + 8),
    ]
    if args.num_threads:
        argv += ["--num-threads", str(args.num_threads)]
    if args.disable_torch_compile:
        argv.append("--disable-torch-compile")
    with tempfile.NamedTemporaryFile(prefix="areal_serve_", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            while True:
                if proc.poll() is not None:
                    tail = Path(log.name).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"areal serve exited with {proc.returncode}; its log ({log.name}) ends:\n{tail}")
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.5)
            return asyncio.run(_http_run(url, prompts, args.new_tokens))
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)


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
