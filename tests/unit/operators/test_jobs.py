"""``LocalJobs`` against real detached commands: state transitions and exit codes, a job that
outlives the process that submitted it, cancel killing the whole process group (grandchildren
included, SIGTERM-ignoring ones by SIGKILL), name-collision refusal, resubmission as a new attempt,
and a dead wrapper or a reused pid not taken for a running job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from areal_tasks.errors import SchedulerError
from areal_tasks.launch.jobs import LocalJobs, validate_job_name

PY = sys.executable


def wait_state(jobs: LocalJobs, name: str, timeout: float = 20.0) -> str:
    """Poll until the job leaves ``running``; its final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = jobs.status(name).state
        if state != "running":
            return state
        time.sleep(0.05)
    raise AssertionError(f"job {name} still running after {timeout}s")


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_missing_job(jobs: LocalJobs) -> None:
    status = jobs.status("nothing")
    assert status.state == "missing" and status.pid is None and status.attempt == 0
    assert jobs.cancel("nothing").state == "missing"
    assert jobs.log_tail("nothing") == ""


def test_success_and_failure_exit_codes(jobs: LocalJobs, tmp_path: Path) -> None:
    ok = jobs.submit("ok", [PY, "-c", "print('all good')"], run_dir=tmp_path / "run_ok")
    assert ok.state == "running" and ok.attempt == 1 and ok.run_dir == str(tmp_path / "run_ok")
    assert (tmp_path / "run_ok").is_dir()
    jobs.submit("bad", [PY, "-c", "import sys; print('boom'); sys.exit(3)"])
    assert wait_state(jobs, "ok") == "succeeded"
    assert jobs.status("ok").exit_code == 0
    assert wait_state(jobs, "bad") == "failed"
    status = jobs.status("bad")
    assert status.exit_code == 3
    assert "exited with code 3" in status.reason and "boom" in status.reason
    assert "boom" in jobs.log_tail("bad", 5) and "all good" in jobs.log_tail("ok")


def test_env_cwd_and_unstartable_command(jobs: LocalJobs, tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    code = f"import json, os; json.dump([os.environ['AREAL_X'], os.getcwd()], open({str(out)!r}, 'w'))"
    jobs.submit("env", [PY, "-c", code], {"AREAL_X": "42"}, cwd=tmp_path)
    assert wait_state(jobs, "env") == "succeeded"
    assert json.loads(out.read_text()) == ["42", str(tmp_path)]
    jobs.submit("nope", ["/nonexistent/binary-xyz"])
    assert wait_state(jobs, "nope") == "failed"
    assert jobs.status("nope").exit_code == 127
    assert "cannot start" in jobs.log_tail("nope")


def test_running_name_is_refused_and_resubmission_is_a_new_attempt(jobs: LocalJobs) -> None:
    jobs.submit("dup", [PY, "-c", "import time; time.sleep(30)"])
    with pytest.raises(SchedulerError, match="already running"):
        jobs.submit("dup", [PY, "-c", "pass"])
    assert jobs.cancel("dup", grace_s=5).state == "cancelled"
    second = jobs.submit("dup", [PY, "-c", "import sys; sys.exit(0)"])
    assert second.attempt == 2
    assert wait_state(jobs, "dup") == "succeeded"
    assert sorted(p.name for p in (jobs.root / "dup").iterdir() if p.is_dir()) == ["attempt_1", "attempt_2"]


def test_bad_names_and_empty_argv_are_refused(jobs: LocalJobs) -> None:
    for bad in ("", "a/b", "../x", ".hidden", "x" * 300, "sp ace"):
        with pytest.raises(SchedulerError, match="not usable"):
            validate_job_name(bad)
    with pytest.raises(SchedulerError, match="argv is empty"):
        jobs.submit("empty", [])


def test_cancel_kills_grandchildren_gracefully(jobs: LocalJobs, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    status = jobs.submit("tree", [PY, "-c", code])
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the job never started its child"
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    assert pid_alive(grandchild) and os.getpgid(grandchild) == status.pid
    started = time.monotonic()
    cancelled = jobs.cancel("tree", grace_s=10)
    assert time.monotonic() - started < 5, "SIGTERM should have been enough"
    assert cancelled.state == "cancelled" and cancelled.exit_code == 128 + signal.SIGTERM
    assert not pid_alive(grandchild) and not pid_alive(status.pid)
    assert jobs.cancel("tree").state == "cancelled"  # cancelling an ended job changes nothing


def test_cancel_sigkills_what_ignores_sigterm(jobs: LocalJobs) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    )
    status = jobs.submit("stubborn", [PY, "-c", code])
    deadline = time.monotonic() + 10
    while "ready" not in jobs.log_tail("stubborn"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    cancelled = jobs.cancel("stubborn", grace_s=0.5)
    assert 0.4 < time.monotonic() - started < 8
    assert cancelled.state == "cancelled"
    assert not pid_alive(status.pid)


def test_job_survives_the_submitting_process(jobs: LocalJobs, tmp_path: Path) -> None:
    """A separate Python process submits the job and exits; the job keeps running and is found by name."""
    code = (
        "import sys; from areal_tasks.launch.jobs import LocalJobs\n"
        f"LocalJobs({str(jobs.root)!r}).submit('orphan', [sys.executable, '-c', 'import time; time.sleep(1.5)'])\n"
    )
    subprocess.run([PY, "-c", code], check=True, timeout=60)
    status = jobs.status("orphan")
    assert status.state == "running"
    assert wait_state(jobs, "orphan") == "succeeded"


def test_killed_wrapper_is_a_failure_and_leftovers_are_stopped_on_resubmit(jobs: LocalJobs, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    status = jobs.submit("oom", [PY, "-c", code])
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(status.pid, signal.SIGKILL)  # the wrapper dies as under the OOM killer; its child lives on
    assert wait_state(jobs, "oom") == "failed"
    assert "without recording an exit code" in jobs.status("oom").reason
    child = int(pid_file.read_text())
    assert pid_alive(child)
    jobs.submit("oom", [PY, "-c", "pass"])
    assert not pid_alive(child), "the orphan of the killed attempt must be stopped before a resubmission"
    assert wait_state(jobs, "oom") == "succeeded"


def test_reused_pid_is_not_taken_for_the_job(jobs: LocalJobs) -> None:
    status = jobs.submit("reuse", [PY, "-c", "pass"])
    assert wait_state(jobs, "reuse") == "succeeded"
    folder = jobs.root / "reuse" / "attempt_1"
    (folder / "exit_code").unlink()
    record = json.loads((folder / "job.json").read_text())
    record["pid"] = os.getpid()  # a live process that is not the job (same pid, another start time)
    (folder / "job.json").write_text(json.dumps(record))
    assert status.pid != os.getpid()
    assert jobs.status("reuse").state == "failed"


def test_the_job_record_and_log_hide_secret_flags(jobs: LocalJobs, tmp_path: Path, caplog) -> None:
    """A key passed on a job's command line runs as given but stays out of the record and the log."""
    with caplog.at_level("INFO", logger="areal_tasks.launch.jobs"):
        jobs.submit(
            "secret",
            [PY, "-c", "import sys; sys.exit(0 if sys.argv[2][::-1] == '2retnuh' else 4)", "--api-key", "hunter2"],
        )
    assert wait_state(jobs, "secret") == "succeeded", "the job did not get its real arguments"
    records = list(jobs.root.rglob("job.json"))
    text = "".join(r.read_text() for r in records)
    assert records and "hunter2" not in text and "--api-key" in text
    assert "hunter2" not in caplog.text
