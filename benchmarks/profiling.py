"""Helpers the benchmark scripts share for timing GPU work and reading torch profiler traces."""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Callable

__all__ = [
    "IDLE_BINS_US",
    "KERNEL_KINDS",
    "busy_fraction",
    "cuda_median_ms",
    "device_kernels",
    "device_time_by_kind",
    "idle_gaps",
    "idle_summary",
    "kernel_kind",
    "kernel_table",
    "print_kernel_table",
    "top_kernels_by_kind",
]

#: (kind, pattern of device kernel names), first match wins; what a train step's device time goes to.
KERNEL_KINDS: list[tuple[str, str]] = [
    (
        "attention",
        r"flash|fmha|attention|sdpa",
    ),  # before matmul: flash and cuDNN kernels' names carry cutlass/sm90 types
    ("matmul", r"gemm|nvjet|cutlass|xmma|sm90_|sm80_|splitK"),
    ("lm_head soft-max", r"partial_stats|combine_stats|logit_grad|logsumexp|_exp_gather|arange_eq_exp"),
    ("optimizer and clipping", r"adam|multi_tensor|foreach|norm_kernel|lpnorm"),
    ("compiled element-wise", r"^triton_"),
    ("copies and casts", r"copy|cast|chunk_cat|memcpy|memset|CatArray|split_with_sizes|fill|zero"),
]


def cuda_median_ms(call: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``call`` on the current CUDA stream (CUDA events around each of
    ``repeats`` calls, after ``warmup`` untimed ones)."""
    import torch

    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def device_kernels(events) -> list:
    """The device kernels (and copies) of ``prof.events()``: device events that are not the device-side
    spans of annotated regions (``record_function`` ranges such as ``FSDP::pre_forward``, which
    cover every kernel launched inside them and the idle time between)."""
    from torch.autograd import DeviceType

    return [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]


def kernel_kind(name: str) -> str:
    """The :data:`KERNEL_KINDS` kind of a device kernel's name, or ``other``."""
    for kind, pattern in KERNEL_KINDS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return kind
    return "other"


def _kernel_totals(events) -> dict[str, list[float]]:
    """Device kernel name -> [microseconds, launches] over ``prof.events()``."""
    totals: dict[str, list[float]] = {}
    for event in device_kernels(events):
        entry = totals.setdefault(event.name, [0.0, 0])
        entry[0] += event.time_range.end - event.time_range.start
        entry[1] += 1
    return totals


def _totals_by_kind(events) -> dict[str, dict[str, list[float]]]:
    """:func:`kernel_kind` -> :func:`_kernel_totals` of that kind's kernels."""
    by_kind: dict[str, dict[str, list[float]]] = {}
    for name, entry in _kernel_totals(events).items():
        by_kind.setdefault(kernel_kind(name), {})[name] = entry
    return by_kind


def device_time_by_kind(events) -> dict[str, float]:
    """Milliseconds of device kernels by :func:`kernel_kind` (``events`` is ``prof.events()``),
    costliest first."""
    totals = {kind: sum(us for us, _ in names.values()) / 1e3 for kind, names in _totals_by_kind(events).items()}
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def top_kernels_by_kind(events, top: int = 5) -> dict[str, list[dict]]:
    """For each :func:`kernel_kind`, its ``top`` costliest kernel names with their milliseconds and
    launches (``events`` is ``prof.events()``): what a kind's time, ``other`` above all, is made of."""
    return {
        kind: [
            {"kernel": name, "ms": us / 1e3, "launches": int(count)}
            for name, (us, count) in sorted(names.items(), key=lambda item: -item[1][0])[:top]
        ]
        for kind, names in _totals_by_kind(events).items()
    }


def busy_fraction(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Share of ``[start, end]`` covered by the union of ``intervals`` (overlaps counted once)."""
    covered, reach = 0.0, start
    for lo, hi in sorted(intervals):
        a, b = max(lo, reach), min(hi, end)
        if b > a:
            covered += b - a
            reach = b
    return covered / (end - start) if end > start else 0.0


def kernel_table(events, calls: int, top: int = 20) -> list[dict]:
    """Device kernels of a torch-profiler run grouped by name, costliest first: per profiled call
    (``calls`` of them) the milliseconds and launches of each kernel name, and its share of the
    total. ``events`` is ``prof.events()``; kernels inside CUDA-graph replays count too."""
    totals = _kernel_totals(events)
    whole = sum(us for us, _ in totals.values()) or 1.0
    rows = [
        {"kernel": name, "ms_per_call": us / 1e3 / calls, "launches_per_call": count / calls, "share": us / whole}
        for name, (us, count) in sorted(totals.items(), key=lambda item: -item[1][0])
    ]
    return rows[:top]


def print_kernel_table(title: str, rows: list[dict], width: int = 70) -> None:
    """Print :func:`kernel_table`'s rows."""
    print(f"\n{title}")
    print(f"{'kernel':<{width}} {'ms/call':>8} {'launches':>9} {'share':>6}")
    for row in rows:
        name = row["kernel"] if len(row["kernel"]) <= width else row["kernel"][: width - 3] + "..."
        print(
            f"{name:<{width}} {row['ms_per_call']:>8.3f} {row['launches_per_call']:>9.1f} {100 * row['share']:>5.1f}%"
        )


def _device_gaps(events) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(the device kernels' intervals, sorted; the stretches between them with no kernel running),
    in microseconds of ``prof.events()``."""
    kernels = sorted((e.time_range.start, e.time_range.end) for e in device_kernels(events))
    gaps: list[tuple[float, float]] = []
    if kernels:
        reach = kernels[0][1]
        for a, b in kernels[1:]:
            if a > reach:
                gaps.append((reach, a))
            reach = max(reach, b)
    return kernels, gaps


def idle_gaps(events, min_us: float = 500.0, top: int = 12) -> list[dict]:
    """The longest stretches with no device kernel running, each with the host operators that ran
    during it (the outermost ones first: what the host was busy with while the device waited).
    ``events`` is ``prof.events()``; times in microseconds from the first event."""
    from torch.autograd import DeviceType

    kernels, all_gaps = _device_gaps(events)
    host = [e for e in events if e.device_type == DeviceType.CPU]
    if not kernels:
        return []
    origin = min(e.time_range.start for e in events)
    gaps = sorted((g for g in all_gaps if g[1] - g[0] >= min_us), key=lambda g: g[0] - g[1])
    rows = []
    for a, b in gaps[:top]:
        overlapping = [
            (min(b, e.time_range.end) - max(a, e.time_range.start), e.name)
            for e in host
            if e.time_range.start < b and e.time_range.end > a
        ]
        names: list[str] = []
        for _, name in sorted(overlapping, key=lambda item: -item[0]):
            if name not in names:
                names.append(name)
        rows.append({"start_ms": (a - origin) / 1e3, "ms": (b - a) / 1e3, "host": names[:6]})
    return rows


#: gap-length bins of :func:`idle_summary`, in microseconds
IDLE_BINS_US = (20.0, 100.0, 500.0)


def idle_summary(events, tenths: int = 10) -> dict:
    """Where the device waited, in milliseconds: before its first kernel (``lead_ms``), after its
    last (``tail_ms``), between kernels by gap length (``by_length``: count and total per bin of
    :data:`IDLE_BINS_US`: many short gaps mean launch-bound stretches, a few long ones host work),
    and per tenth of the profiled span (``by_tenth_ms``: which phase of the step waits)."""
    kernels, gaps = _device_gaps(events)
    if not kernels:
        return {}
    origin = min(e.time_range.start for e in events)
    end = max(e.time_range.end for e in events)
    reach = max(b for _, b in kernels)
    span = (end - origin) / tenths
    edges = (0.0, *IDLE_BINS_US, float("inf"))
    bins = [{"range_us": f"{lo:g}-{hi:g}", "count": 0, "ms": 0.0} for lo, hi in itertools.pairwise(edges)]
    by_tenth = [0.0] * tenths
    for a, b in gaps:
        length = b - a
        slot = next(i for i, (lo, hi) in enumerate(itertools.pairwise(edges)) if lo <= length < hi)
        bins[slot]["count"] += 1
        bins[slot]["ms"] += length / 1e3
        for i in range(tenths):  # the gap's overlap with each tenth
            lo, hi = origin + i * span, origin + (i + 1) * span
            by_tenth[i] += max(0.0, min(b, hi) - max(a, lo)) / 1e3
    return {
        "lead_ms": (kernels[0][0] - origin) / 1e3,
        "tail_ms": (end - reach) / 1e3,
        "by_length": bins,
        "by_tenth_ms": by_tenth,
    }
