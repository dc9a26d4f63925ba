"""The validation report: one :class:`CheckResult` per check (and node), serialised to JSON.

A check passes, fails, warns (it ran and found something worth knowing that does not stop a run,
e.g. a multi-node run on a local filesystem) or is skipped (an earlier failure made it pointless).
The report is ``ok`` when nothing failed; every failure converts to a
:class:`~storage.errors.StorageValidationError` naming the check, node, path and fix.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field
from typing import Any

from storage.errors import StorageConfigError, StorageValidationError

__all__ = ["MAX_LATENCY_SAMPLES", "MAX_PROBE_MB", "CheckResult", "Status", "Thresholds", "ValidationReport"]

#: largest throughput probe, MiB: it is held in memory twice (written, read back), and a bigger one
#: measures nothing a 1 GiB one does not.
MAX_PROBE_MB = 1024.0
#: most small-object operations timed for the latency figure.
MAX_LATENCY_SAMPLES = 1000


class Status(str, enum.Enum):
    """Outcome of one check."""

    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"


@dataclass(frozen=True)
class Thresholds:
    """Limits the checks compare measurements against; ``None`` = measure and report only."""

    #: free space required at the path (local/NFS only), in GB (10^9 bytes).
    min_free_gb: float | None = 1.0
    #: sequential write throughput of one large object, MB/s (10^6 bytes per second).
    min_write_mbps: float | None = None
    #: sequential read throughput of the same object, MB/s.
    min_read_mbps: float | None = None
    #: median latency of one small-object operation (write, read or delete), ms.
    max_latency_ms: float | None = None
    #: largest tolerated difference between this machine's clock and the S3 server's, seconds.
    max_clock_skew_s: float = 30.0
    #: size of the object the throughput check writes and reads, MiB.
    probe_mb: float = 8.0
    #: small-object operations timed for the latency figure.
    latency_samples: int = 5

    def __post_init__(self) -> None:
        """StorageConfigError (a ValueError) for a negative, non-finite or unusable limit."""
        for name in ("min_free_gb", "min_write_mbps", "min_read_mbps", "max_latency_ms"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise StorageConfigError(f"Thresholds.{name}={value!r} must be >= 0 and finite, or None")
        if not (math.isfinite(self.max_clock_skew_s) and self.max_clock_skew_s > 0):
            raise StorageConfigError(f"max_clock_skew_s={self.max_clock_skew_s!r} must be a finite number > 0")
        if not (math.isfinite(self.probe_mb) and 0 < self.probe_mb <= MAX_PROBE_MB):
            raise StorageConfigError(
                f"probe_mb={self.probe_mb!r} must be > 0 and <= {MAX_PROBE_MB:g} MiB (the probe is held in memory "
                "twice; a few MiB measure throughput well enough)"
            )
        if not 1 <= self.latency_samples <= MAX_LATENCY_SAMPLES:
            raise StorageConfigError(f"latency_samples={self.latency_samples!r} must be 1..{MAX_LATENCY_SAMPLES}")


@dataclass
class CheckResult:
    """One check's outcome on one node. ``fix`` says what to do when it did not pass."""

    check: str
    status: Status
    node: str
    path: str
    message: str
    fix: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.value,
            "node": self.node,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
            "details": self.details,
            "seconds": round(self.seconds, 4),
        }

    def error(self) -> StorageValidationError:
        """This result as the typed error (meaningful for failures)."""
        return StorageValidationError(self.check, self.node, self.path, self.message, self.fix or "see the message")


@dataclass
class ValidationReport:
    """Every check result for one storage URL, in the order the checks ran."""

    url: str
    kind: str
    nodes: int = 1
    storage: dict[str, Any] = field(default_factory=dict)
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings and skips do not fail a report)."""
        return not self.failures()

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL]

    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.WARN]

    def result(self, check: str, node: str | None = None) -> CheckResult:
        """The (first) result of ``check`` (on ``node``); KeyError if there is none."""
        for r in self.results:
            if r.check == check and (node is None or r.node == node):
                return r
        raise KeyError(f"no result for check {check!r}" + (f" on {node}" if node else ""))

    def errors(self) -> list[StorageValidationError]:
        """Every failure as a typed error."""
        return [r.error() for r in self.failures()]

    def raise_on_failure(self) -> None:
        """Raise the first failure's StorageValidationError (mentioning how many more failed)."""
        errors = self.errors()
        if not errors:
            return
        first = errors[0]
        if len(errors) > 1:
            first.args = (f"{first.args[0]} (and {len(errors) - 1} more failed check(s))",)
        raise first

    def to_dict(self) -> dict[str, Any]:
        counts = {status.value: sum(r.status is status for r in self.results) for status in Status}
        return {
            "url": self.url,
            "kind": self.kind,
            "ok": self.ok,
            "nodes": self.nodes,
            "storage": self.storage,
            "summary": counts,
            "checks": [r.to_dict() for r in self.results],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)
