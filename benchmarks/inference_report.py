"""Rows and the printed table of the inference throughput benchmark (``inference_throughput.py``):
a row per measurement (printed the moment it is measured, so a later failure keeps it), and one
table pairing each workload's engine and HTTP figures with their ratio.
"""

from __future__ import annotations

from inference_workloads import Workload  # benchmarks/, the script's directory


class Rows:
    """The report's measured rows, in order; each printed as it is added."""

    def __init__(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens
        self.rows: list[dict] = []

    def add(self, row: dict) -> dict:
        self.rows.append(row)
        ratio = f" ({row['vs_engine']:.0%} of the engine)" if row.get("vs_engine") is not None else ""
        print(
            f"measured: {row['system']}, batch {row['batch']}: {row['tokens_per_s']:,.0f} tokens/s{ratio}", flush=True
        )
        return row

    def measured(self, system: str, batch: int, seconds: float, **extra: object) -> dict:
        """A row of ``batch`` sequences of ``new_tokens`` each, generated in ``seconds``."""
        return self.add(
            {
                "system": system,
                "batch": batch,
                "seconds": seconds,
                "tokens_per_s": batch * self.new_tokens / seconds,
                **extra,
            }
        )

    def workload(self, work: Workload, path: str, seconds: float, anatomy: dict | None = None) -> dict:
        """A workload's row through ``path`` ("engine" or "http"); an HTTP row carries
        ``vs_engine``, its throughput over the engine row of the same workload (None without one)."""
        system = ("embedded engine, " if path == "engine" else "areal serve over HTTP, ") + work.label
        extra: dict = {"workload": work.key, "mode": work.mode, "kind": work.kind, "n": work.n, "path": path}
        if path == "http":
            engine = self.find(work.key, "engine")
            tokens_per_s = work.sequences * self.new_tokens / seconds
            extra["vs_engine"] = tokens_per_s / engine["tokens_per_s"] if engine else None
        return self.measured(system, work.sequences, seconds, **extra, **(anatomy or {}))

    def find(self, key: str, path: str) -> dict | None:
        return next((r for r in self.rows if r.get("workload") == key and r.get("path") == path), None)


def print_table(rows: list[dict], title: str) -> None:
    """One line per workload (engine and HTTP side by side), then the rows of one path only
    (no-overlap, CUDA variants, ``transformers generate``) in the engine column."""
    print(f"\n{title}")
    print(
        f"{'workload':<44} {'batch':>6} {'engine tok/s':>13} {'HTTP tok/s':>11} {'HTTP/engine':>11} "
        f"{'ms/step':>8} {'wait ms':>8}"
    )
    seen: set[str] = set()
    for row in rows:
        key = row.get("workload")
        if key in seen:
            continue
        if key is None:
            name, engine, http = row["system"], row, None
        else:
            seen.add(key)
            engine = next((r for r in rows if r.get("workload") == key and r["path"] == "engine"), None)
            http = next((r for r in rows if r.get("workload") == key and r["path"] == "http"), None)
            name = row["system"].split(", ", 1)[1]
        engine_text = f"{engine['tokens_per_s']:>13,.0f}" if engine else f"{'':>13}"
        http_text = f"{http['tokens_per_s']:>11,.0f}" if http else f"{'':>11}"
        ratio = f"{http['vs_engine']:>11.1%}" if http and http.get("vs_engine") is not None else f"{'':>11}"
        step = (
            f"{engine['ms_per_step']:>8.2f} {engine['wait_ms_per_step']:>8.2f}"
            if engine and "ms_per_step" in engine
            else ""
        )
        print(f"{name:<44} {row['batch']:>6} {engine_text} {http_text} {ratio} {step}".rstrip())
    print(
        "(batch: sequences generated at once; ms/step: host time of an engine decode step, wait ms: the part "
        "spent waiting for the device)"
    )
    print_time_split(rows)


def print_time_split(rows: list[dict]) -> None:
    """Where each run's wall time went, from the engine's counters (``decode_anatomy``): decode
    steps, admission prefills, and the rest (the engine idle: over HTTP, waiting for requests to
    arrive or for answers to leave). Rows without counters (``transformers generate``) are left out."""
    timed = [r for r in rows if "prefills" in r]
    if not timed:
        return
    print("\nwhere the wall time went (the engine's counters; other: neither decoding nor prefilling)")
    print(
        f"{'system':<62} {'batch':>6} {'wall s':>7} {'steps':>6} {'decode s':>9} {'prefills':>9} "
        f"{'prefill s':>10} {'other s':>8}"
    )
    for r in timed:
        print(
            f"{r['system'][:62]:<62} {r['batch']:>6} {r['seconds']:>7.3f} {r['decode_steps']:>6} {r['decode_s']:>9.3f} "
            f"{r['prefills']:>9} {r['prefill_s']:>10.3f} {r['other_s']:>8.3f}"
        )
