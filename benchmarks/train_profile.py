"""Diagnostics of the train throughput benchmark (``train_throughput.py``): extra steps under the
torch profiler (costliest operators, GPU-busy fraction, device time by kind of kernel, where the
device waited), the host-device synchronisations of a block, and the compiled graphs, graph breaks
and caching-allocator driver calls of a run.

Run as part of the benchmark script: ``benchmarks/`` is the script's directory, first on
``sys.path``, so the siblings ``profiling``, ``train_batches`` and ``train_timing`` import as
top-level modules.
"""

from __future__ import annotations

import collections
import contextlib
import warnings
from collections.abc import Iterator

import torch
import torch.distributed as dist
from profiling import (
    busy_fraction,
    device_kernels,
    device_time_by_kind,
    idle_gaps,
    idle_summary,
    top_kernels_by_kind,
)
from train_batches import pg_loss, token_weight
from train_timing import _sync, _timed_pipelined

from areal_tasks.engine.fsdp.engine import FSDPEngine


def _profile_step(engine: FSDPEngine, batches: list[dict]) -> dict | None:
    """Extra (untimed) steps under the torch profiler: one step on its own, or several back to back
    as the pipelined timing runs them (each step's stats read after the next is submitted). Rank 0
    prints the costliest operators and returns ``{"steps", "step_s", "gpu_busy_s",
    "gpu_busy_fraction", "device_ms_by_kind", "device_top_kernels", "idle_gaps", "idle"}`` (None on
    CPU): ``step_s``, ``gpu_busy_s`` and ``device_ms_by_kind`` per step (the profiled span over
    ``steps``), the top kernels, idle gaps and idle summary over the whole span. Busy time counts
    device kernels only, not the device-side spans of annotated regions."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    _sync()
    with profile(activities=activities) as prof, _synchronisations() as syncs:
        if len(batches) == 1:
            engine.train_batch(batches[0], pg_loss, token_weight)
        else:
            _timed_pipelined(engine, batches)
    _sync()
    n = len(batches)
    if dist.get_rank() != 0:
        return None
    averages = prof.key_averages()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    print(averages.table(sort_by=key, row_limit=20, max_name_column_width=60))
    print(averages.table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))
    if not on_gpu:
        return None
    for where, count in syncs.most_common():
        print(f"synchronisation x{count}: {where}")
    events = prof.events()
    start = min(e.time_range.start for e in events)
    end = max(e.time_range.end for e in events)
    kernels = [(e.time_range.start, e.time_range.end) for e in device_kernels(events)]
    fraction = busy_fraction(kernels, start, end)
    summary = {
        "steps": n,
        "step_s": (end - start) / 1e6 / n,
        "gpu_busy_s": fraction * (end - start) / 1e6 / n,
        "gpu_busy_fraction": fraction,
    }
    print(
        f"profiled {n} step(s): {summary['step_s']:.3f} s a step, GPU busy {summary['gpu_busy_s']:.3f} s "
        f"({100 * fraction:.1f} %)"
    )
    summary["device_ms_by_kind"] = {kind: ms / n for kind, ms in device_time_by_kind(events).items()}
    print(
        "device time by kind of kernel:", ", ".join(f"{k} {v:.1f} ms" for k, v in summary["device_ms_by_kind"].items())
    )
    summary["device_top_kernels"] = top_kernels_by_kind(events)
    for kind, rows in summary["device_top_kernels"].items():
        print(
            f"  {kind} (all {n} steps): "
            + "; ".join(f"{r['kernel'][:90]} {r['ms']:.1f} ms x{r['launches']}" for r in rows)
        )
    summary["idle_gaps"] = idle_gaps(events)
    print("longest device idle stretches (ms from the step's start, length, host operators meanwhile):")
    for gap in summary["idle_gaps"]:
        print(f"  at {gap['start_ms']:8.1f} ms  {gap['ms']:6.2f} ms  {' > '.join(gap['host'])[:200]}")
    summary["idle"] = idle = idle_summary(events)
    print(
        f"device idle: {idle['lead_ms']:.2f} ms before the first kernel, {idle['tail_ms']:.2f} ms after the last; "
        "between kernels "
        + ", ".join(f"{b['range_us']} us: {b['count']} gaps {b['ms']:.1f} ms" for b in idle["by_length"])
    )
    print("device idle per tenth of the profiled span (ms): " + " ".join(f"{v:.1f}" for v in idle["by_tenth_ms"]))
    return summary


@contextlib.contextmanager
def _synchronisations() -> Iterator[collections.Counter]:
    """Count the host-device synchronisations inside the block by the Python line that caused them
    (torch's CUDA sync debug mode warns on each; a no-op without CUDA)."""
    found: collections.Counter = collections.Counter()
    if not torch.cuda.is_available():
        yield found
        return
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield found
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    for warning in caught:
        if "synchroniz" in str(warning.message).lower():
            found[f"{warning.filename}:{warning.lineno}"] += 1


def _dynamo_counts() -> dict[str, int]:
    """Graphs compiled and graph breaks over the run (a break splits a block into several graphs,
    each with its own host overhead)."""
    from torch._dynamo.utils import counters

    return {
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def _allocator_counts() -> dict[str, int]:
    """The caching allocator's driver calls so far: ``cudaMalloc`` (``num_device_alloc``),
    ``cudaFree`` (``num_device_free``) and the retries after an allocation failed and the cache
    was emptied (``num_alloc_retries``); zeros without CUDA. Growing during timed steps means
    shapes the cache could not serve."""
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries")
    if not torch.cuda.is_available():
        return dict.fromkeys(keys, 0)
    stats = torch.cuda.memory_stats()
    return {key: int(stats.get(key, 0)) for key in keys}
