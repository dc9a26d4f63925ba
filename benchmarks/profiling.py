"""Helpers the benchmark scripts share for reading torch profiler traces."""

from __future__ import annotations

__all__ = ["busy_fraction", "idle_gaps", "kernel_table", "print_kernel_table"]


def busy_fraction(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Share of ``[start, end]`` covered by the union of ``intervals`` (overlaps counted once)."""
    covered, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered / (end - start) if end > start else 0.0


def kernel_table(events, calls: int, top: int = 20) -> list[dict]:
    """Device kernels of a torch-profiler run grouped by name, costliest first: per profiled call
    (``calls`` of them) the milliseconds and launches of each kernel name, and its share of the
    total. ``events`` is ``prof.events()``; kernels inside CUDA-graph replays count too."""
    from torch.autograd import DeviceType

    totals: dict[str, list[float]] = {}
    for event in events:
        if event.device_type != DeviceType.CUDA:
            continue
        entry = totals.setdefault(event.name, [0.0, 0])
        entry[0] += event.time_range.end - event.time_range.start
        entry[1] += 1
    whole = sum(us for us, _ in totals.values()) or 1.0
    rows = [{"kernel": name, "ms_per_call": us / 1e3 / calls, "launches_per_call": count / calls,
             "share": us / whole}
            for name, (us, count) in sorted(totals.items(), key=lambda item: -item[1][0])]
    return rows[:top]


def print_kernel_table(title: str, rows: list[dict], width: int = 70) -> None:
    """Print :func:`kernel_table`'s rows."""
    print(f"\n{title}")
    print(f"{'kernel':<{width}} {'ms/call':>8} {'launches':>9} {'share':>6}")
    for row in rows:
        name = row["kernel"] if len(row["kernel"]) <= width else row["kernel"][: width - 3] + "..."
        print(f"{name:<{width}} {row['ms_per_call']:>8.3f} {row['launches_per_call']:>9.1f} {100 * row['share']:>5.1f}%")


def idle_gaps(events, min_us: float = 500.0, top: int = 12) -> list[dict]:
    """The longest stretches with no device kernel running, each with the host operators that ran
    during it (the outermost ones first: what the host was busy with while the device waited).
    ``events`` is ``prof.events()``; times in microseconds from the first event."""
    from torch.autograd import DeviceType

    kernels = sorted((e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA)
    host = [e for e in events if e.device_type == DeviceType.CPU]
    if not kernels:
        return []
    origin = min(e.time_range.start for e in events)
    gaps, reach = [], kernels[0][1]
    for a, b in kernels[1:]:
        if a - reach >= min_us:
            gaps.append((reach, a))
        reach = max(reach, b)
    gaps.sort(key=lambda g: g[0] - g[1])
    rows = []
    for a, b in gaps[:top]:
        overlapping = [(min(b, e.time_range.end) - max(a, e.time_range.start), e.name) for e in host
                       if e.time_range.start < b and e.time_range.end > a]
        names: list[str] = []
        for _, name in sorted(overlapping, key=lambda item: -item[0]):
            if name not in names:
                names.append(name)
        rows.append({"start_ms": (a - origin) / 1e3, "ms": (b - a) / 1e3, "host": names[:6]})
    return rows
