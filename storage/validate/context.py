"""Running checks: the shared context, the outcome types and the one place failures become results.

A check is a function returning :class:`Outcome` (pass or warn, with a message and measurements)
or raising :class:`CheckFailed` (message, fix, details). :meth:`CheckContext.run` times it and
records a :class:`~storage.validate.report.CheckResult`; a storage or OS error escaping a check is
recorded as a failure with a fix chosen by its type, since a pre-flight check must report, not crash.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from storage.errors import (
    StorageConnectionError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTransientError,
)
from storage.storage import Storage
from storage.validate.report import CheckResult, Status, Thresholds, ValidationReport

__all__ = ["CheckContext", "CheckFailed", "Outcome"]

logger = logging.getLogger(__name__)


@dataclass
class Outcome:
    """A check that did not fail: ``status`` PASS or WARN (a WARN carries a ``fix``)."""

    message: str
    details: dict[str, Any] = field(default_factory=dict)
    status: Status = Status.PASS
    fix: str | None = None


class CheckFailed(StorageError):
    """Raised by a check function: what is wrong, how to fix it, and what was measured."""

    def __init__(self, message: str, fix: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.details = details or {}


def fix_for(error: BaseException) -> str:
    """A generic fix for a storage error that a check did not anticipate."""
    if isinstance(error, StoragePermissionError):
        return "give this user/identity read and write access to the path, or choose one it can write"
    if isinstance(error, StorageNotFoundError):
        return "create the location (or its bucket) or correct the URL"
    if isinstance(error, StorageConnectionError):
        return "check the endpoint URL, that the server runs, and the network path to it"
    if isinstance(error, StorageTransientError):
        return "the storage failed repeatedly; check its health and retry later"
    return "see the message; check the storage's health and configuration"


@dataclass
class CheckContext:
    """What every check needs: the storage, where it runs, the thresholds and the report to fill."""

    storage: Storage
    node: str
    thresholds: Thresholds
    report: ValidationReport
    nodes: int = 1
    #: this machine's clock (seconds since the epoch), compared with the S3 server's.
    clock: Callable[[], float] = time.time
    #: scratch key below the root for probe files, unique per validation run.
    scratch: str = field(default_factory=lambda: f".areal-validate-{uuid.uuid4().hex[:12]}")

    def run(self, check: str, fn: Callable[[], Outcome], *, path: str | None = None) -> CheckResult:
        """Run ``fn`` as ``check`` and record its result."""
        where = path or str(self.storage.url)
        start = time.perf_counter()
        try:
            outcome = fn()
            result = CheckResult(check, outcome.status, self.node, where, outcome.message, outcome.fix, outcome.details)
        except CheckFailed as exc:
            result = CheckResult(check, Status.FAIL, self.node, where, exc.message, exc.fix, exc.details)
        except (StorageError, OSError) as exc:
            result = CheckResult(
                check, Status.FAIL, self.node, where, str(exc), fix_for(exc), {"error": type(exc).__name__}
            )
        result.seconds = time.perf_counter() - start
        log = logger.info if result.status in (Status.PASS, Status.SKIP) else logger.warning
        log("check %s on %s: %s - %s", check, self.node, result.status.value, result.message)
        self.report.results.append(result)
        return result

    def skip(self, check: str, reason: str, *, path: str | None = None) -> CheckResult:
        """Record ``check`` as skipped because of ``reason``."""
        result = CheckResult(check, Status.SKIP, self.node, path or str(self.storage.url), reason)
        self.report.results.append(result)
        return result
