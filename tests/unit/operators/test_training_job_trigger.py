"""``TrainingJobTrigger``: serialize() round-trips to an equal trigger, and run() yields exactly one
terminal event for real detached jobs (succeeded, failed, cancelled while polled), an error event
when polling raises or the job record is gone, and logs progress from rl_metrics.jsonl."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.launch.jobs import JobStatus, LocalJobs
from operators.triggers.training_job import TrainingJobTrigger, _Progress

PY = sys.executable


def collect(trigger: TrainingJobTrigger, timeout: float = 30.0) -> list[Any]:
    """Every event the trigger yields before its run() returns (the triggerer would stop at the first)."""

    async def drain() -> list[Any]:
        return [event async for event in trigger.run()]

    return asyncio.run(asyncio.wait_for(drain(), timeout))


def trigger_for(jobs: LocalJobs, name: str, poll: float = 0.05) -> TrainingJobTrigger:
    return TrainingJobTrigger(name, str(jobs.root), "local", poll_interval=poll)


def test_serialize_round_trip() -> None:
    trigger = TrainingJobTrigger("dag__run__train", "/tmp/jobs", "local", poll_interval=2.5, cancel_grace_s=7)
    classpath, kwargs = trigger.serialize()
    module, _, cls_name = classpath.rpartition(".")
    assert classpath == "operators.triggers.training_job.TrainingJobTrigger"
    rebuilt = getattr(importlib.import_module(module), cls_name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    json.dumps(kwargs)  # the triggerer stores the kwargs as JSON
    assert kwargs == {"job_name": "dag__run__train", "jobs_root": "/tmp/jobs", "scheduler": "local",
                      "poll_interval": 2.5, "cancel_grace_s": 7.0}  # fmt: skip


def test_succeeded_job_yields_one_event(jobs: LocalJobs, tmp_path: Path) -> None:
    jobs.submit("ok", [PY, "-c", "import time; time.sleep(0.3)"], run_dir=tmp_path / "run")
    events = collect(trigger_for(jobs, "ok"))
    assert len(events) == 1
    assert events[0].payload == {"status": "succeeded", "reason": "exited with code 0", "job_name": "ok",
                                 "run_dir": str(tmp_path / "run"), "exit_code": 0}  # fmt: skip


def test_failed_job_yields_one_failed_event(jobs: LocalJobs) -> None:
    jobs.submit("bad", [PY, "-c", "import sys; print('trainer crashed'); sys.exit(3)"])
    events = collect(trigger_for(jobs, "bad"))
    assert len(events) == 1
    payload = events[0].payload
    assert payload["status"] == "failed" and payload["exit_code"] == 3
    assert "exited with code 3" in payload["reason"] and "trainer crashed" in payload["reason"]


def test_job_cancelled_while_polled(jobs: LocalJobs) -> None:
    jobs.submit("long", [PY, "-c", "import time; time.sleep(60)"])
    canceller = threading.Timer(0.5, lambda: jobs.cancel("long", grace_s=5))
    canceller.start()
    try:
        events = collect(trigger_for(jobs, "long"))
    finally:
        canceller.join()
    assert [e.payload["status"] for e in events] == ["cancelled"]


def test_missing_job_is_an_error_event(jobs: LocalJobs) -> None:
    events = collect(trigger_for(jobs, "never_submitted"))
    assert len(events) == 1
    assert events[0].payload["status"] == "error" and "no record" in events[0].payload["reason"]


class _BrokenHook:
    """A cluster hook whose lookup works ``ok_polls`` times and then raises (a lost NFS mount, say)."""

    def __init__(self, ok_polls: int) -> None:
        self.ok_polls = ok_polls

    def get_job(self, name: str) -> JobStatus:
        if self.ok_polls <= 0:
            raise OSError("Stale file handle")
        self.ok_polls -= 1
        return JobStatus(name, "running", "running as process group 1", "/nonexistent/run", None, 1, 1)


class _TriggerWithHook(TrainingJobTrigger):
    hook: Any = None

    def _hook(self) -> Any:
        return self.hook


@pytest.mark.parametrize("ok_polls", [0, 2])
def test_polling_error_becomes_one_error_event(ok_polls: int) -> None:
    trigger = _TriggerWithHook("j", "/unused", poll_interval=0.01)
    trigger.hook = _BrokenHook(ok_polls)
    events = collect(trigger)
    assert len(events) == 1
    payload = events[0].payload
    assert payload["status"] == "error" and payload["job_name"] == "j"
    assert "OSError: Stale file handle" in payload["reason"]
    assert payload["run_dir"] == (None if ok_polls == 0 else "/nonexistent/run")


def test_unknown_scheduler_is_an_error_event() -> None:
    events = collect(TrainingJobTrigger("j", "/tmp/x", scheduler="slurm", poll_interval=0.01))
    assert len(events) == 1 and events[0].payload["status"] == "error"
    assert "supported schedulers: local" in events[0].payload["reason"]


def test_on_kill_cancels_the_job(jobs: LocalJobs) -> None:
    jobs.submit("killme", [PY, "-c", "import time; time.sleep(60)"])
    asyncio.run(TrainingJobTrigger("killme", str(jobs.root), cancel_grace_s=5).on_kill())
    assert jobs.status("killme").state == "cancelled"


def test_progress_reads_only_new_complete_lines(tmp_path: Path) -> None:
    progress = _Progress()
    assert progress.read(str(tmp_path)) is None  # no metrics file yet
    path = tmp_path / "rl_metrics.jsonl"
    path.write_text(json.dumps({"step": 1, "reward/mean": 0.25}) + "\n" + '{"step": 2, "rew')
    assert progress.read(str(tmp_path)) == "step 1: reward/mean=0.25"
    assert progress.read(str(tmp_path)) is None  # the partial line is not read yet
    with open(path, "a") as handle:
        handle.write('ard/mean": 0.5, "actor/loss": 0.125}\n')
    assert progress.read(str(tmp_path)) == "step 2: reward/mean=0.5, actor/loss=0.125"


def test_progress_is_logged_while_running(
    jobs: LocalJobs, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    code = (f"import json, time; open({str(run_dir / 'rl_metrics.jsonl')!r}, 'w').write(json.dumps("
            "{'step': 7, 'reward/mean': 0.5}) + '\\n'); time.sleep(0.6)")  # fmt: skip
    jobs.submit("progress", [PY, "-c", code], run_dir=run_dir)
    with caplog.at_level("INFO"):
        events = collect(trigger_for(jobs, "progress"))
    assert [e.payload["status"] for e in events] == ["succeeded"]
    # Airflow routes a trigger's log through structlog (stdout here), not the logging module
    logged = capsys.readouterr().out + "\n".join(r.getMessage() for r in caplog.records)
    assert "job progress: step 7: reward/mean=0.5" in logged
