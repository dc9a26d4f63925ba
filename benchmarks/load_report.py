"""The report of the server load test (``server_load.py``): status histograms, latency percentiles,
429s, ``/health`` latency, memory, drain and stop times, as a dict (the JSON) and a table.

A class's statuses are *unexpected* when they are not what its :class:`~load_requests.Kind` expects:
valid requests 200 or 429, invalid ones any 4xx, a disconnecting client no status.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from load_requests import KINDS

__all__ = ["percentile", "print_report", "summarize"]

REPO = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(records: list[dict], base: list[float], samples: list[dict], **facts: Any) -> dict[str, Any]:
    """The report (see the module docstring)."""
    by_kind: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        by_kind[r["kind"]][str(r["status"]) if r["status"] is not None else (r["error"] or "gone")] += 1
    valid = [r["latency_s"] for r in records if r["kind"] in ("valid_generate", "valid_chat") and r["status"] == 200]
    rss = [s["rss_mib"] for s in samples if s["rss_mib"] is not None]
    health = [s["health_s"] for s in samples]
    retry_after = [float(r["retry_after"]) for r in records if r["status"] == 429 and r["retry_after"]]
    expected = {k.name: k.expect for k in KINDS}
    unexpected = {}
    for name, counts in by_kind.items():
        allowed = {"ok": {"200", "429"}, "4xx": None, "gone": {"gone", "200"}}[expected[name]]
        bad = {
            s: n
            for s, n in counts.items()
            if (allowed is None and not (s.isdigit() and 400 <= int(s) < 500)) or (allowed and s not in allowed)
        }
        if bad:
            unexpected[name] = bad
    loaded_p99, base_p99 = percentile(valid, 99), percentile(base, 99)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.processor() or platform.machine()})",
        "commit": _commit(),
        **facts,
        "requests": len(records),
        "status_by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "unexpected_by_kind": unexpected,
        "error_examples": {r["kind"]: r["detail"] for r in records if r.get("detail")},
        "n_5xx": sum(1 for r in records if r["status"] is not None and r["status"] >= 500),
        "valid_ok": len(valid),
        "valid_per_s": len(valid) / facts["load_wall_s"] if facts.get("load_wall_s") else None,
        "latency_unloaded_s": {"p50": percentile(base, 50), "p95": percentile(base, 95), "p99": base_p99},
        "latency_loaded_s": {"p50": percentile(valid, 50), "p95": percentile(valid, 95), "p99": loaded_p99},
        "p99_ratio": loaded_p99 / base_p99 if loaded_p99 and base_p99 else None,
        "n_429": sum(1 for r in records if r["status"] == 429),
        "retry_after_mean_s": statistics.fmean(retry_after) if retry_after else None,
        "n_429_without_retry_after": sum(1 for r in records if r["status"] == 429 and not r["retry_after"]),
        "health_s": {"max": max(health, default=None), "p99": percentile(health, 99)},
        "health_not_200": sum(1 for s in samples if s["health"] != 200),
        "peak_queue": max((s["queued"] or 0) + (s["running"] or 0) for s in samples) if samples else None,
        "rss_mib": {
            "start": rss[0] if rss else None,
            "peak": max(rss, default=None),
            "end": rss[-1] if rss else None,
            "growth": (max(rss) - rss[0]) if rss else None,
        },
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return out.stdout.strip() or None


def print_report(report: dict[str, Any]) -> None:
    print(
        f"\nserver load: {report['requests']} requests from {report['clients']} clients "
        f"over {report['load_wall_s']:.1f} s"
    )
    print(f"{'class':<22} statuses")
    for kind, counts in report["status_by_kind"].items():
        flag = "  <-- unexpected" if kind in report["unexpected_by_kind"] else ""
        print(f"{kind:<22} {', '.join(f'{s}: {n}' for s, n in sorted(counts.items()))}{flag}")
    u, lo = report["latency_unloaded_s"], report["latency_loaded_s"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{1e3 * v:.0f} ms"

    rows = [
        ("5xx responses", report["n_5xx"]),
        ("valid p50 / p95 / p99 unloaded", f"{ms(u['p50'])} / {ms(u['p95'])} / {ms(u['p99'])}"),
        ("valid p50 / p95 / p99 loaded", f"{ms(lo['p50'])} / {ms(lo['p95'])} / {ms(lo['p99'])}"),
        ("valid ok, per second", f"{report['valid_ok']}, {report['valid_per_s'] or 0:.1f}/s"),
        ("429s (mean Retry-After)", f"{report['n_429']} ({report['retry_after_mean_s']})"),
        (
            "/health max, p99; not 200",
            f"{ms(report['health_s']['max'])}, {ms(report['health_s']['p99'])}; {report['health_not_200']}",
        ),
        ("peak running + queued", report["peak_queue"]),
        (
            "RSS start / peak / end MiB",
            "{start} / {peak} / {end}".format(
                **{k: "-" if v is None else f"{v:.0f}" for k, v in report["rss_mib"].items()}
            ),
        ),
        ("drain after load", ms(report["drain_s"]) if report["drain_s"] is not None else "not drained"),
        ("alive at end", report["alive_at_end"]),
        ("stop after SIGTERM", ms(report["stop_s"]) if report["stop_s"] is not None else "SIGKILL needed"),
    ]
    for label, value in rows:
        print(f"{label:<32} {value}")
