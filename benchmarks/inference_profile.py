"""Profiling of the inference throughput benchmark (``inference_throughput.py --profile``, and its
CUDA runs): the host and device time of a decode step's parts outside any engine, the kernels of
one decode forward, and one engine run under ``cProfile`` and the torch profiler.

Run as part of the benchmark script: ``benchmarks/`` is the script's directory, first on
``sys.path``, so the sibling ``profiling`` and ``inference_runs`` import as top-level modules.
"""

from __future__ import annotations

import time

import torch
from inference_runs import run_engine  # benchmarks/, the script's directory


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
        # the table is built once, as the engine builds it (when a batch's rows change): its
        # host-to-device copy is not part of a step's sampling
        table = SamplingBatch.build([params] * batch, [None] * batch, logits.device)

        def draw(table=table) -> None:
            sample(logits, table, runner.greedy)

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
