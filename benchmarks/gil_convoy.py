"""What a busy event loop costs the engine thread in the same process: the interpreter lock's convoy.

``areal serve`` runs its HTTP event loop and its engine thread in one process. Every torch call
releases the interpreter lock while its kernel runs (or launches) and takes it back after. While
the other thread runs pure Python (the event loop parsing a burst of requests, writing answers),
taking it back waits until that thread is forced to drop it, which CPython does only once a
waiter has waited a whole switch interval (``sys.setswitchinterval``, 5 ms by default). So the
engine thread gets one torch call through per switch interval: an admission prefill of a few
hundred kernel launches stretches from milliseconds to a second.

For each switch interval in ``--intervals-us`` this calls a small torch op (``torch.add`` on 64
floats: the op's own time is negligible, as a kernel launch's is) for ``--seconds`` alone and for
``--seconds`` beside a thread that runs pure Python without pause, and counts that thread's loop
iterations alone and beside the calls: microseconds a call, and the busy thread's rate as a share
of its rate alone. Intervals are set process-wide for the row and restored after.

Prints a table and writes JSON (``benchmarks/results/gil_convoy_cpu.json`` by default).

Usage::

    python benchmarks/gil_convoy.py
    python benchmarks/gil_convoy.py --intervals-us 5000,500,50 --seconds 2
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def op_us(seconds: float, tensor: torch.Tensor) -> float:
    """Microseconds a call of ``torch.add`` on this thread, calling it for ``seconds``."""
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        torch.add(tensor, 1)
        calls += 1
    return elapsed / calls * 1e6


class BusyPython:
    """A thread that runs pure Python until stopped, counting its loop iterations."""

    def __init__(self) -> None:
        self.iterations = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="busy-python", daemon=True)

    def _run(self) -> None:
        stop = self._stop
        while not stop.is_set():
            sum(range(50))
            self.iterations += 1

    def __enter__(self) -> BusyPython:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def busy_rate(seconds: float) -> float:
    """Iterations a second of :class:`BusyPython` over ``seconds`` with nothing beside it."""
    with BusyPython() as busy:
        start = time.perf_counter()
        time.sleep(seconds)  # sleeping releases the lock: the busy thread has it alone
        return busy.iterations / (time.perf_counter() - start)


def measure(interval_us: float, seconds: float, tensor: torch.Tensor) -> dict[str, Any]:
    """One row: the op's cost alone and beside a busy thread, and that thread's share of its rate,
    each over ``seconds``."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(interval_us / 1e6)
    try:
        alone = op_us(seconds, tensor)
        alone_rate = busy_rate(seconds)
        with BusyPython() as busy:
            time.sleep(0.05)  # the busy thread holds the lock before the ops start
            first = busy.iterations
            start = time.perf_counter()
            beside = op_us(seconds, tensor)
            rate = (busy.iterations - first) / (time.perf_counter() - start)
    finally:
        sys.setswitchinterval(saved)
    return {
        "switch_interval_us": interval_us,
        "op_us_alone": alone,
        "op_us_beside_busy_thread": beside,
        "slowdown": beside / alone,
        "busy_thread_rate_share": rate / alone_rate,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intervals-us", default="5000,1000,500,100,20", help="comma-separated switch intervals")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds each of a row's timings runs")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    intervals = [float(value) for value in args.intervals_us.split(",") if value]
    if not intervals or any(value <= 0 for value in intervals):
        parser.error(f"--intervals-us: give positive microseconds, got {args.intervals_us!r}")
    if not 0 < args.seconds < 600:
        parser.error(f"--seconds: give 0..600 seconds, got {args.seconds}")

    torch.set_num_threads(1)
    tensor = torch.ones(64)
    rows = []
    print(f"{'switch interval':>16} | {'us/op alone':>11} | {'us/op beside busy':>17} | {'slowdown':>8} | busy share")
    for interval in intervals:
        row = measure(interval, args.seconds, tensor)
        rows.append(row)
        print(
            f"{interval:>13.0f} us | {row['op_us_alone']:>11.2f} | {row['op_us_beside_busy_thread']:>17.1f} | "
            f"{row['slowdown']:>7.0f}x | {row['busy_thread_rate_share']:.0%}",
            flush=True,
        )
    report = {
        "benchmark": "gil_convoy",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "seconds": args.seconds,
        "rows": rows,
    }
    out = args.out or RESULTS / "gil_convoy_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
