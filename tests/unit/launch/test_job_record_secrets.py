"""A detached job's record, log and exit code are its owner's (0700 folders, 0600 files) and hold no
secret given on its command line or in its environment (issue #26: ``job.json`` was 0644 and kept
``--aws-secret-access-key``, ``storage.options.secret=``, URL passwords in its argv)."""

from __future__ import annotations

import json
import stat
import sys
import time
from pathlib import Path

from areal_tasks.launch.jobs import LocalJobs

SECRETS = ("S3CRET1", "S3CRET2", "PASS3", "S3CRET4", "K5KEY", "T6TOKEN", "ENVSECRET7")


def _wait_ended(jobs: LocalJobs, name: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = jobs.status(name).state
        if state != "running":
            return state
        time.sleep(0.05)
    raise AssertionError(f"job {name} still running after {timeout}s")


def test_job_files_are_private_and_hold_no_secret(tmp_path: Path) -> None:
    jobs = LocalJobs(tmp_path / "jobs")
    argv = [
        sys.executable,
        "-c",
        "print('job ran')",
        "--aws-secret-access-key",
        "S3CRET1",
        "storage.options.secret=S3CRET2",
        "tracking.mlflow_uri=https://user:PASS3@mlflow.example/",
        "storage.url=s3://AKIA:S3CRET4@bucket/x",
        "--api-key",
        "K5KEY",
        "--hf-token=T6TOKEN",
    ]
    status = jobs.submit("leak", argv, env={"AREAL_CONFIG_SECRETS": '{"storage.options.secret": "ENVSECRET7"}'})
    assert _wait_ended(jobs, "leak") == "succeeded"
    attempt = Path(status.log_path).parent
    assert "job ran" in jobs.log_tail("leak")

    for folder in (attempt, attempt.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for name in ("job.json", "job.log", "exit_code"):
        assert stat.S_IMODE((attempt / name).stat().st_mode) == 0o600, name

    everything = "".join(p.read_text(errors="replace") for p in (tmp_path / "jobs").rglob("*") if p.is_file())
    for secret in SECRETS:
        assert secret not in everything, secret
    record = json.loads((attempt / "job.json").read_text())
    assert record["env_keys"] == ["AREAL_CONFIG_SECRETS"]
    assert "--aws-secret-access-key" in record["argv"] and "storage.options.secret=***" in record["argv"]
    assert "tracking.mlflow_uri=https://user:***@mlflow.example/" in record["argv"]
    assert not list(attempt.glob(".*"))  # no temporary file left behind
