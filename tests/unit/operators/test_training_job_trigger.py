"""``TrainingJobTrigger``: serialize() round-trips to an equal trigger, and run() yields exactly one
terminal event for real detached jobs (succeeded, failed, cancelled while polled), an error event
when polling raises or the job record is gone, and logs short progress lines from the SFT and RL
metrics files (at most one per poll and phase, never silently past the newest step)."""

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

from areal_tasks.api.jobs import JobStatus
from areal_tasks.launch.jobs import LocalJobs
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
    trigger = TrainingJobTrigger(
        "dag__run__train", "/tmp/jobs", "ray", poll_interval=2.5, cancel_grace_s=7, conn_id="my_ray"
    )
    classpath, kwargs = trigger.serialize()
    module, _, cls_name = classpath.rpartition(".")
    assert classpath == "operators.triggers.training_job.TrainingJobTrigger"
    rebuilt = getattr(importlib.import_module(module), cls_name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    json.dumps(kwargs)  # the triggerer stores the kwargs as JSON
    assert kwargs == {
        "job_name": "dag__run__train",
        "jobs_root": "/tmp/jobs",
        "scheduler": "ray",
        "poll_interval": 2.5,
        "cancel_grace_s": 7.0,
        "conn_id": "my_ray",
    }


def test_succeeded_job_yields_one_event(jobs: LocalJobs, tmp_path: Path) -> None:
    jobs.submit("ok", [PY, "-c", "import time; time.sleep(0.3)"], run_dir=tmp_path / "run")
    events = collect(trigger_for(jobs, "ok"))
    assert len(events) == 1
    assert events[0].payload == {
        "status": "succeeded",
        "reason": "exited with code 0",
        "job_name": "ok",
        "run_dir": str(tmp_path / "run"),
        "exit_code": 0,
    }


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
    assert (
        events[0].payload["status"] == "error"
        and "is no longer known to the local scheduler" in events[0].payload["reason"]
    )


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
    events = collect(TrainingJobTrigger("j", "/tmp/x", scheduler="k8s", poll_interval=0.01))
    assert len(events) == 1 and events[0].payload["status"] == "error"
    assert "supported schedulers: local" in events[0].payload["reason"]


def test_on_kill_cancels_the_job(jobs: LocalJobs) -> None:
    jobs.submit("killme", [PY, "-c", "import time; time.sleep(60)"])
    asyncio.run(TrainingJobTrigger("killme", str(jobs.root), cancel_grace_s=5).on_kill())
    assert jobs.status("killme").state == "cancelled"


def write_config(run_dir: Path, name: str, sft_steps: int, total_steps: int) -> None:
    """A resolved-config YAML like the job writes (only the train section matters here)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / name).write_text(
        f"# resolved\nexperiment:\n  name: x\ntrain:\n  batch_size: 8\n"
        f"  total_steps: {total_steps}\n  sft_warmup_steps: {sft_steps}\n"
    )


def append(path: Path, *rows: dict[str, Any], tail: str = "") -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows) + tail)


def test_rl_progress_reads_only_new_complete_lines(tmp_path: Path) -> None:
    progress = _Progress()
    assert progress.read(str(tmp_path)) == [] and progress.read(None) == []  # no metrics file, no run dir
    write_config(tmp_path, "rl_config.yaml", sft_steps=300, total_steps=340)
    path = tmp_path / "rl_metrics.jsonl"
    append(path, {"step": 1, "reward/mean": 0.25, "staleness/mean": 0.0, "perf/step_s": 1.5}, tail='{"step": 2, "rew')
    assert progress.read(str(tmp_path)) == ["rl step 1/40 reward 0.250 stale 0 1.50 s/step"]
    assert progress.read(str(tmp_path)) == []  # the partial line is not read yet
    append(path, tail='ard/mean": 0.5, "eval/reward": 0.625, "actor/loss": 0.125}\n')
    assert progress.read(str(tmp_path)) == ["rl step 2/40 reward 0.500 eval 0.625"]


def test_several_new_steps_give_the_newest_and_their_count(tmp_path: Path) -> None:
    progress = _Progress()
    append(tmp_path / "rl_metrics.jsonl", *({"step": k, "reward/mean": k / 10} for k in (1, 2, 3)))
    assert progress.read(str(tmp_path)) == ["rl step 3 reward 0.300 (3 new steps)"]  # no config: no total
    append(tmp_path / "rl_metrics.jsonl", {"step": 4, "reward/mean": float("nan")})
    assert progress.read(str(tmp_path)) == ["rl step 4"]  # a non-finite metric is left out
    append(tmp_path / "rl_metrics.jsonl", {"step": 5}, tail="not json\n")
    assert progress.read(str(tmp_path)) == ["rl: 2 new metrics line(s), the last is not a JSON object"]
    append(tmp_path / "rl_metrics.jsonl", [6])  # type: ignore[arg-type]
    assert progress.read(str(tmp_path)) == ["rl: 1 new metrics line(s), the last is not a JSON object"]


def test_sft_progress_counts_steps_done_out_of_the_warm_start(tmp_path: Path) -> None:
    progress = _Progress()
    write_config(tmp_path, "config.yaml", sft_steps=300, total_steps=340)  # before sft_config.yaml exists
    path = tmp_path / "sft_metrics.jsonl"
    append(path, *({"step": k, "loss": 7.0 - k, "grad_norm": 1.0, "lr": 1e-3, "step_s": 0.7} for k in range(12)))
    assert progress.read(str(tmp_path)) == ["sft step 12/300 loss -4.000 (12 new steps)"]
    append(path, {"step": 12, "loss": 0.4123})
    assert progress.read(str(tmp_path)) == ["sft step 13/300 loss 0.412"]
    assert progress.read(str(tmp_path)) == []
    # the last SFT step, then RL: one line per phase in the same poll, SFT first
    append(path, *({"step": k, "loss": 0.27} for k in range(13, 300)))
    write_config(tmp_path, "rl_config.yaml", sft_steps=300, total_steps=340)
    append(tmp_path / "rl_metrics.jsonl", {"step": 1, "reward/mean": 0.47})
    assert progress.read(str(tmp_path)) == ["sft step 300/300 loss 0.270 (287 new steps)", "rl step 1/40 reward 0.470"]


def test_a_rewritten_metrics_file_is_read_from_its_start(tmp_path: Path) -> None:
    progress = _Progress()
    path = tmp_path / "sft_metrics.jsonl"
    append(path, *({"step": k, "loss": 1.0} for k in range(50)))
    assert progress.read(str(tmp_path)) == ["sft step 50 loss 1.000 (50 new steps)"]
    write_config(tmp_path, "sft_config.yaml", sft_steps=60, total_steps=70)
    path.write_text(json.dumps({"step": 0, "loss": 7.0}) + "\n")  # a resubmitted job restarted SFT
    assert progress.read(str(tmp_path)) == ["sft step 1/60 loss 7.000"]


def test_progress_lines_stay_short(tmp_path: Path) -> None:
    write_config(tmp_path, "rl_config.yaml", sft_steps=300_000, total_steps=400_000)
    row = {
        "step": 99_999,
        "reward/mean": -123.456789,
        "eval/reward": 0.123456,
        "staleness/mean": 12.3456,
        "perf/step_s": 12345.678,
        "actor/loss": 1e-30,
        **{f"extra/{k}": k for k in range(50)},
    }
    append(tmp_path / "rl_metrics.jsonl", *([row] * 12_345))
    (line,) = _Progress().read(str(tmp_path))
    assert line.startswith("rl step 99999/100000 reward -123.457 eval 0.123 stale 12 ") and len(line) <= 100, line


def test_progress_is_logged_while_running(
    jobs: LocalJobs, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    write_config(run_dir, "config.yaml", sft_steps=2, total_steps=9)
    code = (
        f"import json, time; open({str(run_dir / 'sft_metrics.jsonl')!r}, 'w').write(json.dumps("
        "{'step': 1, 'loss': 0.5}) + '\\n'); time.sleep(0.4); "
        f"open({str(run_dir / 'rl_metrics.jsonl')!r}, 'w').write(json.dumps("
        "{'step': 7, 'reward/mean': 0.5}) + '\\n'); time.sleep(0.6)"
    )
    jobs.submit("progress", [PY, "-c", code], run_dir=run_dir)
    with caplog.at_level("INFO"):
        events = collect(trigger_for(jobs, "progress"))
    assert [e.payload["status"] for e in events] == ["succeeded"]
    # Airflow routes a trigger's log through structlog (stdout here), not the logging module
    logged = capsys.readouterr().out + "\n".join(r.getMessage() for r in caplog.records)
    assert "sft step 2/2 loss 0.500" in logged and "rl step 7/7 reward 0.500" in logged
    assert logged.count("sft step 2/2") == 1 and logged.count("rl step 7/7") == 1  # once each, not every poll


def test_the_last_steps_of_an_ended_job_are_reported(
    jobs: LocalJobs, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    code = (
        f"import json; open({str(run_dir / 'rl_metrics.jsonl')!r}, 'w').write(''.join(json.dumps("
        "{'step': k, 'reward/mean': 0.5}) + '\\n' for k in (1, 2, 3)))"
    )
    jobs.submit("quick", [PY, "-c", code], run_dir=run_dir)
    deadline = time.monotonic() + 30
    while jobs.status("quick").state == "running" and time.monotonic() < deadline:
        time.sleep(0.05)  # the job ends before the trigger's first (and only) poll
    with caplog.at_level("INFO"):
        events = collect(trigger_for(jobs, "quick", poll=30.0))
    assert [e.payload["status"] for e in events] == ["succeeded"]
    logged = capsys.readouterr().out + "\n".join(r.getMessage() for r in caplog.records)
    assert "rl step 3 reward 0.500 (3 new steps)" in logged
