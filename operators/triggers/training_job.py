"""``TrainingJobTrigger``: waits in the triggerer for an RL job to end, without holding a worker slot.

It polls the job through the scheduler's cluster hook (in a thread: the hook reads files and
``/proc``, which must not block the triggerer's event loop) every ``poll_interval`` seconds, logs a
progress line when the run directory's ``rl_metrics.jsonl`` grows, and yields exactly one
:class:`TriggerEvent`::

    {"status": "succeeded" | "failed" | "cancelled" | "error", "reason": str,
     "job_name": str, "run_dir": str | None, "exit_code": int | None}

``error`` means the job could not be polled (the exception's type and message are the reason); the
job itself may still be running, and the operator's next try reattaches to it. When a user kills
the deferred task (mark failed, clear), :meth:`on_kill` cancels the job.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

__all__ = ["TrainingJobTrigger"]

#: file in the run directory holding one JSON line of metrics per RL step.
METRICS_FILE = "rl_metrics.jsonl"
#: metrics quoted in a progress line, when present.
PROGRESS_KEYS = ("reward/mean", "eval/reward", "actor/loss", "staleness/mean", "perf/step_s")


class TrainingJobTrigger(BaseTrigger):
    """Poll job ``job_name`` (records under ``jobs_root``) on ``scheduler`` until it ends."""

    def __init__(
        self, job_name: str, jobs_root: str, scheduler: str = "local", poll_interval: float = 5.0,
        cancel_grace_s: float = 20.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.job_name = job_name
        self.jobs_root = str(jobs_root)
        self.scheduler = scheduler
        self.poll_interval = float(poll_interval)
        self.cancel_grace_s = float(cancel_grace_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_name": self.job_name,
                "jobs_root": self.jobs_root,
                "scheduler": self.scheduler,
                "poll_interval": self.poll_interval,
                "cancel_grace_s": self.cancel_grace_s,
            },
        )

    def _hook(self) -> Any:
        from operators.hooks.cluster import get_cluster_hook

        return get_cluster_hook(self.scheduler, jobs_root=self.jobs_root)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        progress = _Progress()
        run_dir: str | None = None
        try:
            hook = self._hook()
            while True:
                status = await asyncio.to_thread(hook.get_job, self.job_name)
                run_dir = status.run_dir
                if status.state == "missing":
                    yield self._event("error", f"job {self.job_name} has no record under {self.jobs_root}: "
                                      f"it was removed while the task waited ({status.reason})", run_dir)  # fmt: skip
                    return
                if status.state != "running":
                    yield self._event(status.state, status.reason, run_dir, status.exit_code)
                    return
                line = await asyncio.to_thread(progress.read, run_dir)
                if line:
                    self.log.info("job %s: %s", self.job_name, line)
                await asyncio.sleep(self.poll_interval)
        except Exception as exc:  # a process boundary: a polling failure becomes the one terminal event
            self.log.exception("polling job %s failed", self.job_name)
            yield self._event("error", f"polling job {self.job_name} failed: {type(exc).__name__}: {exc}", run_dir)

    async def on_kill(self) -> None:
        """The user killed the deferred task: cancel the job (gracefully, then forcefully)."""
        self.log.info("task killed by the user: cancelling job %s", self.job_name)
        status = await asyncio.to_thread(self._hook().cancel_job, self.job_name, self.cancel_grace_s)
        self.log.info("job %s is %s: %s", self.job_name, status.state, status.reason)

    def _event(self, status: str, reason: str, run_dir: str | None, exit_code: int | None = None) -> TriggerEvent:
        return TriggerEvent(
            {"status": status, "reason": reason, "job_name": self.job_name, "run_dir": run_dir, "exit_code": exit_code}
        )


class _Progress:
    """Reads the lines appended to ``<run_dir>/rl_metrics.jsonl`` since the last look."""

    def __init__(self) -> None:
        self.offset = 0

    def read(self, run_dir: str | None) -> str | None:
        """A one-line summary of the newest complete metrics line, or None when nothing new was written."""
        if not run_dir:
            return None
        path = Path(run_dir) / METRICS_FILE
        try:
            with open(path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return None
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        lines = [line for line in complete.decode("utf-8", errors="replace").splitlines() if line.strip()]
        if not lines:
            return None
        try:
            last = json.loads(lines[-1])
        except json.JSONDecodeError:
            return f"{len(lines)} new metrics line(s) (the last is not JSON)"
        step = last.get("step", "?")
        shown = ", ".join(f"{k}={last[k]:.4g}" for k in PROGRESS_KEYS if isinstance(last.get(k), (int, float)))
        return f"step {step}" + (f": {shown}" if shown else "")
