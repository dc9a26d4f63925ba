"""Helpers the benchmark scripts share for reading torch profiler traces."""

from __future__ import annotations

__all__ = ["busy_fraction", "kernel_table", "print_kernel_table"]


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
