"""Checks every backend gets: a write-read-delete round trip with a content hash, and throughput and
latency measured against thresholds. All probe objects live under the context's scratch key and are
removed afterwards (:func:`cleanup`)."""

from __future__ import annotations

import hashlib
import os
import statistics
import time

from storage.errors import StorageError, StorageNotFoundError, StoragePermissionError
from storage.validate.context import CheckContext, CheckFailed, Outcome
from storage.validate.report import CheckResult, Status

__all__ = ["ROUND_TRIP_BYTES", "check_round_trip", "check_throughput", "cleanup"]

ROUND_TRIP_BYTES = 256 * 1024

_CONSISTENCY_FIX = (
    "the storage does not return what was written: check caching layers (NFS attribute/lookup caches, "
    "a proxy, an eventually consistent gateway) and the storage's health"
)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_round_trip(ctx: CheckContext) -> Outcome:
    """Write random bytes, read them back and compare hashes, list, delete, confirm the delete."""
    storage, key = ctx.storage, f"{ctx.scratch}/roundtrip.bin"
    data = os.urandom(ROUND_TRIP_BYTES)
    expected = _sha256(data)
    try:
        storage.write_bytes(key, data)
    except StoragePermissionError as exc:
        raise CheckFailed(
            f"cannot write: {exc}",
            "grant write access to this path/bucket (or mount it read-write), or choose a writable location",
        ) from exc
    got = _sha256(storage.read_bytes(key))
    if got != expected:
        raise CheckFailed(f"content read back differs: sha256 {got} != {expected} written", _CONSISTENCY_FIX)
    if "roundtrip.bin" not in storage.list(ctx.scratch):
        raise CheckFailed(
            f"{storage.url_for(key)} was written but is missing from its directory listing", _CONSISTENCY_FIX
        )
    storage.delete(key)
    if storage.exists(key):
        raise CheckFailed(f"{storage.url_for(key)} still exists after it was deleted", _CONSISTENCY_FIX)
    return Outcome(
        f"wrote, read back (sha256 matches), listed and deleted {ROUND_TRIP_BYTES} bytes", {"sha256": expected}
    )


def _mbps(size: int, seconds: float) -> float:
    return size / 1e6 / max(seconds, 1e-9)


def available_memory_bytes() -> int | None:
    """Memory the kernel says a new allocation can get (``MemAvailable``), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_throughput(ctx: CheckContext) -> Outcome:
    """Time one large write and read, and ``latency_samples`` small write/read/delete operations."""
    t = ctx.thresholds
    storage, key = ctx.storage, f"{ctx.scratch}/throughput.bin"
    size = int(t.probe_mb * 2**20)
    available = available_memory_bytes()
    if available is not None and 4 * size > available:  # written and read back: twice, with room to spare
        raise CheckFailed(
            f"a {t.probe_mb:g} MiB probe needs {2 * size / 2**20:.0f} MiB of memory (written, then read back); "
            f"only {available / 2**20:.0f} MiB are available",
            f"use a probe of at most {available / 4 / 2**20:.0f} MiB (--probe-mb)",
        )
    data = os.urandom(size)
    start = time.perf_counter()
    storage.write_bytes(key, data)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    read_back = storage.read_bytes(key)
    read_s = time.perf_counter() - start
    storage.delete(key)
    if len(read_back) != size:
        raise CheckFailed(f"read {len(read_back)} bytes of the {size} written", _CONSISTENCY_FIX)

    op_ms: list[float] = []
    small = os.urandom(1024)
    for i in range(t.latency_samples):
        small_key = f"{ctx.scratch}/latency-{i}.bin"
        for op in (
            lambda key=small_key: storage.write_bytes(key, small),
            lambda key=small_key: storage.read_bytes(key),
            lambda key=small_key: storage.delete(key),
        ):
            start = time.perf_counter()
            op()
            op_ms.append((time.perf_counter() - start) * 1e3)
    details = {
        "probe_bytes": size,
        "write_mbps": round(_mbps(size, write_s), 2),
        "read_mbps": round(_mbps(size, read_s), 2),
        "latency_ms_median": round(statistics.median(op_ms), 3),
        "latency_ms_max": round(max(op_ms), 3),
    }
    problems = []
    if t.min_write_mbps is not None and details["write_mbps"] < t.min_write_mbps:
        problems.append(f"write {details['write_mbps']} MB/s < {t.min_write_mbps} MB/s required")
    if t.min_read_mbps is not None and details["read_mbps"] < t.min_read_mbps:
        problems.append(f"read {details['read_mbps']} MB/s < {t.min_read_mbps} MB/s required")
    if t.max_latency_ms is not None and details["latency_ms_median"] > t.max_latency_ms:
        problems.append(f"median latency {details['latency_ms_median']} ms > {t.max_latency_ms} ms allowed")
    if problems:
        raise CheckFailed(
            "too slow: " + "; ".join(problems),
            "use faster storage (or one closer to the nodes), check for contention, or relax the threshold "
            "(--min-write-mbps, --min-read-mbps, --max-latency-ms)",
            details,
        )
    return Outcome(
        f"write {details['write_mbps']} MB/s, read {details['read_mbps']} MB/s, "
        f"median latency {details['latency_ms_median']} ms",
        details,
        Status.PASS,
    )


def cleanup(ctx: CheckContext) -> None:
    """Remove the scratch directory; a failure to do so is logged, never hidden."""
    try:
        ctx.storage.delete(ctx.scratch, recursive=True, missing_ok=True)
    except StorageNotFoundError:
        return
    except StorageError as exc:
        ctx.report.results.append(
            CheckResult(
                "cleanup",
                Status.WARN,
                ctx.node,
                ctx.storage.url_for(ctx.scratch),
                f"could not remove the probe directory: {exc}",
                "delete it by hand",
            )
        )
