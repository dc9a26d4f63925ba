"""The embedded server's ``/metrics`` values for tests, and waits on them with a deadline.

Most integration tests share one server, so a test that needs "my request is running" first waits
for the server to be idle (``wait_idle``): a request another test left finishing (a disconnected
stream's abort, say) would otherwise satisfy a running-requests gauge of one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

RUNNING = "sglang:num_running_reqs"
QUEUED = "sglang:num_queue_reqs"


def metric(server: httpx.Client | str, name: str) -> float:
    """One metric's value; ``server`` is a client with the server's base URL, or the URL itself."""
    response = httpx.get(f"{server}/metrics", timeout=10.0) if isinstance(server, str) else server.get("/metrics")
    text = response.text
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} missing from /metrics")


def busy(server: httpx.Client | str) -> float:
    """Requests running plus requests queued."""
    return metric(server, RUNNING) + metric(server, QUEUED)


def wait_until(predicate: Callable[[], bool], limit_s: float, what: str, poll_s: float = 0.02) -> None:
    """Poll ``predicate`` until it holds; after ``limit_s`` fail naming ``what`` was awaited."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {limit_s} s")
        time.sleep(poll_s)


def wait_metric(server: httpx.Client | str, name: str, at_least: float, limit_s: float = 60.0) -> None:
    """Wait until metric ``name`` reaches ``at_least``."""
    wait_until(lambda: metric(server, name) >= at_least, limit_s, f"{name} >= {at_least}")


def wait_idle(server: httpx.Client | str, limit_s: float = 30.0, what: str = "an idle server") -> None:
    """Wait until the server runs and queues nothing."""
    wait_until(lambda: busy(server) == 0, limit_s, what)
