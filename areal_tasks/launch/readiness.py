"""One readiness probe of one worker: an HTTP GET or a file's existence.

A probe never raises for a worker that is simply not up yet: connection refused, a timeout or a
missing file are the normal "not ready" answers while polling. It reports why, so that a
readiness timeout can say what the last attempt saw.
"""

from __future__ import annotations

import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass

from areal_tasks.api.scheduler import ReadinessKind

logger = logging.getLogger(__name__)

__all__ = ["ProbeResult", "probe"]


@dataclass(frozen=True)
class ProbeResult:
    """Whether the worker is ready and, if not, what the probe saw."""

    ready: bool
    detail: str


def probe(kind: ReadinessKind, target: str, expect_status: int = 200, timeout_s: float = 2.0) -> ProbeResult:
    """Probe ``target`` (an expanded URL or path) once."""
    if kind == "none":
        return ProbeResult(True, "no readiness check")
    if kind == "file":
        if os.path.exists(target):
            return ProbeResult(True, f"{target} exists")
        return ProbeResult(False, f"{target} does not exist yet")
    return _probe_http(target, expect_status, timeout_s)


def _probe_http(url: str, expect_status: int, timeout_s: float) -> ProbeResult:
    # Loopback health checks must not go through an HTTP proxy from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        logger.debug("GET %s not ready: %s", url, reason)
        return ProbeResult(False, f"GET {url}: {reason}")
    if status == expect_status:
        return ProbeResult(True, f"GET {url} -> {status}")
    return ProbeResult(False, f"GET {url} -> {status}, expected {expect_status}")
