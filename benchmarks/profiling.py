"""Helpers the benchmark scripts share for reading torch profiler traces."""

from __future__ import annotations

__all__ = ["busy_fraction"]


def busy_fraction(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Share of ``[start, end]`` covered by the union of ``intervals`` (overlaps counted once)."""
    covered, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered / (end - start) if end > start else 0.0
