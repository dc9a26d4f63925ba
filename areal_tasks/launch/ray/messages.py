"""The Ray scheduler's failure and timeout messages: what failed, where (the node), the log tail, the fix.

The same shape as the local scheduler's, with the node named (``node 1 (name, address)``) and, for
a worker lost with its supervisor (a node gone, an actor killed), a fix that says so.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from areal_tasks.api.scheduler import WorkerGroupSpec, WorkerInfo

__all__ = ["LOG_TAIL_LINES", "describe_exit", "failure", "first_line", "readiness_timeout"]

LOG_TAIL_LINES = 40


def describe_exit(code: int | None) -> str:
    if code is None or code >= 0:
        return f"exited with exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:  # a real-time or platform-specific signal without a name
        name = f"signal {-code}"
    return f"was killed by {name} (exit code {code})"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (Ray's carry long tracebacks)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def failure(info: WorkerInfo, where: str, reason: str, tail: str, when: str) -> str:
    """``worker g/r (pid P on node N (name, addr)) exited with exit code C <when>.`` + log tail + fix."""
    what = reason or describe_exit(info.exit_code)
    fix = (
        "fix: the node left the Ray cluster (killed, out of memory, network): check it and `ray status`; a retry "
        "resumes from the last checkpoint"
        if reason
        else "fix: read the error in the log above; rerun the worker's command by hand to reproduce it"
    )
    return (
        f"worker {info.name} (pid {info.pid} on {where}) {what} {when}.\n"
        f"log: {info.log_path}\n"
        f"--- last {LOG_TAIL_LINES} log lines ---\n{tail}\n--- end of log ---\n{fix}"
    )


def readiness_timeout(
    spec: WorkerGroupSpec, pending: Sequence[WorkerInfo], last_probe: dict[int, str], timeout: float, tail: str
) -> str:
    """Which workers are not ready, what their last probe saw, the first one's log tail, the fix."""
    lines = [f"{len(pending)} worker(s) of group {spec.name!r} not ready after {timeout:.1f}s:"]
    for info in pending:
        detail = last_probe.get(info.rank, "not probed yet")
        lines.append(f"  {info.name} (pid {info.pid} on {info.host}): last probe: {detail}; log: {info.log_path}")
    lines += [f"--- last {LOG_TAIL_LINES} log lines of {pending[0].name} ---", tail, "--- end of log ---"]
    lines.append(
        f"fix: check that the worker serves its {spec.readiness.kind} readiness target "
        f"({spec.readiness.target}), or raise the timeout (ready_timeout_s; this wait used {timeout:.1f}s) "
        "if it is just slow"
    )
    return "\n".join(lines)
