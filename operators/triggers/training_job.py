"""``TrainingJobTrigger``: waits in the triggerer for an RL job to end, without holding a worker slot.

It polls the job through the scheduler's cluster hook (in a thread: the hook reads files and
``/proc``, which must not block the triggerer's event loop) every ``poll_interval`` seconds, logs
short progress lines from the run directory's per-step metrics -- ``sft_metrics.jsonl`` during the
SFT warm start, ``rl_metrics.jsonl`` during RL -- and yields exactly one :class:`TriggerEvent`::

    {"status": "succeeded" | "failed" | "cancelled" | "error", "reason": str,
     "job_name": str, "run_dir": str | None, "exit_code": int | None}

``error`` means the job could not be polled (the exception's type and message are the reason); the
job itself may still be running, and the operator's next try reattaches to it. When a user kills
the deferred task (mark failed, clear), :meth:`on_kill` cancels the job.

Progress: at most one line per poll and per phase, for the newest step written since the last
poll (the poll that sees the job ended included), saying how many steps it covers when several
arrived, e.g. ``sft step 120/300 loss 0.412 (12 new steps)`` or
``rl step 12/40 reward 0.531 eval 0.600 stale 0 1.94 s/step``.
The totals come from the config the job wrote into its run directory (``sft_config.yaml``,
``rl_config.yaml``, else ``config.yaml``); without one the line reads ``step 120``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

__all__ = ["TrainingJobTrigger"]


class TrainingJobTrigger(BaseTrigger):
    """Poll job ``job_name`` on ``scheduler`` (through its cluster hook: records under ``jobs_root``,
    the Airflow connection ``conn_id``) until it ends."""

    def __init__(
        self,
        job_name: str,
        jobs_root: str,
        scheduler: str = "local",
        poll_interval: float = 5.0,
        cancel_grace_s: float = 20.0,
        conn_id: str | None = None,
    ) -> None:
        super().__init__()
        self.job_name = job_name
        self.jobs_root = str(jobs_root)
        self.scheduler = scheduler
        self.poll_interval = float(poll_interval)
        self.cancel_grace_s = float(cancel_grace_s)
        self.conn_id = conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_name": self.job_name,
                "jobs_root": self.jobs_root,
                "scheduler": self.scheduler,
                "poll_interval": self.poll_interval,
                "cancel_grace_s": self.cancel_grace_s,
                "conn_id": self.conn_id,
            },
        )

    def _hook(self) -> Any:
        from operators.hooks.cluster import get_cluster_hook

        return get_cluster_hook(self.scheduler, jobs_root=self.jobs_root, conn_id=self.conn_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        progress = _Progress()
        run_dir: str | None = None
        try:
            hook = self._hook()
            while True:
                status = await asyncio.to_thread(hook.get_job, self.job_name)
                run_dir = status.run_dir
                if status.state == "missing":
                    yield self._event(
                        "error",
                        f"job {self.job_name} is no longer known to the {self.scheduler} scheduler: "
                        f"it was removed while the task waited ({status.reason})",
                        run_dir,
                    )
                    return
                for line in await asyncio.to_thread(progress.read, run_dir):  # also the last steps of an ended job
                    self.log.info("%s", line)
                if status.state != "running":
                    yield self._event(status.state, status.reason, run_dir, status.exit_code)
                    return
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


@dataclass(frozen=True)
class _Phase:
    """One phase's metrics file and how to show it."""

    name: str
    metrics_file: str
    config_file: str
    #: added to a row's ``step`` to count the steps done (the SFT loop counts from 0).
    step_offset: int
    #: ``(metric key, label, format)`` quoted in the line, when present and finite.
    shown: tuple[tuple[str, str, str], ...]


def _phases() -> tuple[_Phase, _Phase]:
    """The SFT phase (its metrics count steps from 0) and the RL phase (from 1), named as the run
    directory's contract (``areal_tasks.api.run_dir``) says."""
    from areal_tasks.api import run_dir as contract

    sft = _Phase("sft", contract.SFT_METRICS, contract.SFT_CONFIG, 1, (("loss", "loss", "{:.3f}"),))
    rl = _Phase(
        "rl",
        contract.RL_METRICS,
        contract.RL_CONFIG,
        0,
        (
            ("reward/mean", "reward", "{:.3f}"),
            ("eval/reward", "eval", "{:.3f}"),
            ("staleness/mean", "stale", "{:.2g}"),
            ("perf/step_s", "", "{:.2f} s/step"),
        ),
    )
    return sft, rl


def _phase_total(phase: _Phase, run_dir: Path) -> int | None:
    """Steps of ``phase`` from the config the job wrote (None when none is there yet or it is unreadable)."""
    import yaml

    from areal_tasks.api.run_dir import RESOLVED_CONFIG

    # the phase's own config first, then the resolved config the whole job was started with
    for name in (phase.config_file, RESOLVED_CONFIG):
        try:
            train = (yaml.safe_load((run_dir / name).read_text(encoding="utf-8")) or {}).get("train") or {}
            sft, total = int(train.get("sft_warmup_steps") or 0), int(train["total_steps"])
        except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError):
            continue  # progress lines are best effort: a missing total only shortens them
        return sft if phase.name == "sft" else total - sft
    return None


class _Tail:
    """The complete lines appended to one phase's metrics file since the last look."""

    def __init__(self, phase: _Phase) -> None:
        self.phase = phase
        self.offset = 0
        self.total: int | None = None

    def read(self, run_dir: Path) -> str | None:
        """A line for the newest step written since the last call, or None when nothing new is complete."""
        path = run_dir / self.phase.metrics_file
        try:
            with open(path, "rb") as handle:
                if handle.seek(0, 2) < self.offset:  # rewritten (a resubmitted job restarted the phase)
                    self.offset, self.total = 0, None
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return None
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        rows = [line for line in complete.decode("utf-8", errors="replace").splitlines() if line.strip()]
        if not rows:
            return None
        if self.total is None:
            self.total = _phase_total(self.phase, run_dir)
        try:
            last = json.loads(rows[-1])
        except json.JSONDecodeError:
            last = None
        if not isinstance(last, dict):
            return f"{self.phase.name}: {len(rows)} new metrics line(s), the last is not a JSON object"
        return self._format(last, len(rows))

    def _format(self, row: dict[str, Any], new_rows: int) -> str:
        step = row.get("step")
        done = step + self.phase.step_offset if isinstance(step, int) else "?"
        parts = [f"{self.phase.name} step {done}" + (f"/{self.total}" if self.total else "")]
        for key, label, fmt in self.phase.shown:
            value = row.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                parts.append(f"{label} {fmt.format(value)}".strip())
        if new_rows > 1:
            parts.append(f"({new_rows} new steps)")
        return " ".join(parts)


class _Progress:
    """Progress lines of both phases: at most one per phase per call."""

    def __init__(self) -> None:
        self.tails = tuple(_Tail(phase) for phase in _phases())

    def read(self, run_dir: str | None) -> list[str]:
        """New progress lines (SFT first), empty when nothing new was written."""
        if not run_dir:
            return []
        return [line for tail in self.tails if (line := tail.read(Path(run_dir)))]
