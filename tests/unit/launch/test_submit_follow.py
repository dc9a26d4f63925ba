"""``areal train`` outside its cluster: preflight, submit through the kind's JobBackend, follow, exit code.

A fake scheduler kind ("faraway", registered for each test) says the controller may not run here, so
``areal train`` takes the full submit-and-follow path on this machine. Its job backend is
:class:`LocalJobs` with one change: instead of the submitted ``areal train --config <run_dir>/config.yaml``
(which would train) it runs ``fake_job.py`` with that command line, which loads the written config
with the job's environment (so the secrets round trip is checked), prints log lines and writes a
summary, then exits as the test asks.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from areal_tasks.api.jobs import JobBackend, JobStatus
from areal_tasks.config import load_config
from areal_tasks.errors import SchedulerError
from areal_tasks.launch.follow import follow, new_lines
from areal_tasks.launch.jobs import LocalJobs
from areal_tasks.launch.local import LocalScheduler
from areal_tasks.launch.registry import JOB_BACKENDS, SCHEDULERS, job_backend_for, preflight_for, runs_here
from areal_tasks.launch.submit import SUBMITTED_JOB_ENV, build_submission, submit_and_follow

FAKE_JOB = Path(__file__).with_name("fake_job.py")
SECRET = "s3cr3t-value-for-the-test"
KIND = "faraway"


class FarawayScheduler(LocalScheduler):
    """A kind whose controller must run elsewhere (like ray from a login node)."""

    preflights: ClassVar[list[str]] = []

    @classmethod
    def can_run_controller_here(cls, cfg: Any) -> bool:
        return False

    @classmethod
    def preflight(cls, cfg: Any) -> dict[str, Any]:
        cls.preflights.append(cfg.experiment.name)
        if cfg.cluster.nodes > 1:
            raise SchedulerError("the faraway cluster has 1 node alive, the job asks for 2")
        return {"scheduler": KIND, "nodes_alive": 1}


class FarawayJobs(LocalJobs):
    """LocalJobs running fake_job.py in place of the submitted command (which it hands over)."""

    submitted: ClassVar[list[tuple[list[str], dict[str, str], str | None]]] = []

    @classmethod
    def from_config(cls, cfg: Any) -> FarawayJobs:
        return cls(Path(cfg.experiment.run_dir).parent / "jobs")

    def submit(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        run_dir: Any = None,
        *,
        cwd: Any = None,
    ) -> JobStatus:
        FarawayJobs.submitted.append((list(argv), dict(env or {}), None if cwd is None else str(cwd)))
        return super().submit(name, [sys.executable, str(FAKE_JOB), *argv], env, run_dir, cwd=cwd)


@pytest.fixture
def faraway(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """The fake kind registered; a config of it (loaded as local, then switched) with a secret."""
    SCHEDULERS.register(KIND, FarawayScheduler)
    JOB_BACKENDS.register(KIND, FarawayJobs)
    FarawayJobs.submitted = []
    FarawayScheduler.preflights = []
    monkeypatch.delenv(SUBMITTED_JOB_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[3]))
    try:
        cfg = load_config(
            None,
            [
                f"experiment.run_dir={tmp_path / 'run'}",
                "experiment.name=far",
                "experiment.trial=t1",
                f"storage.options.secret={SECRET}",
            ],
        )
        cfg.cluster.scheduler = KIND
        yield cfg
    finally:
        SCHEDULERS.unregister(KIND)
        JOB_BACKENDS.unregister(KIND)


def test_the_registry_helpers_use_the_kinds_class_methods(faraway: Any) -> None:
    assert runs_here(faraway) is False
    assert preflight_for(faraway) == {"scheduler": KIND, "nodes_alive": 1}
    assert isinstance(job_backend_for(faraway), FarawayJobs)
    faraway.cluster.scheduler = "local"
    assert runs_here(faraway) is True
    assert isinstance(job_backend_for(faraway), LocalJobs)
    report = preflight_for(faraway)
    assert report["scheduler"] == "local" and report["cpus"] >= 1 and report["ok"]


def test_the_submission_carries_the_config_in_the_run_dir_and_the_secrets_in_the_env(faraway: Any) -> None:
    sub = build_submission(faraway)
    assert sub.name == "far-t1"
    assert sub.argv == [sys.executable, "-m", "areal_tasks.cli", "train", "--config", sub.config_file]
    assert Path(sub.config_file) == Path(faraway.experiment.run_dir) / "config.yaml"
    text = Path(sub.config_file).read_text()
    assert SECRET not in text and SECRET not in " ".join(sub.argv) and SECRET not in sub.describe()
    assert SECRET in sub.env["AREAL_CONFIG_SECRETS"] and sub.env[SUBMITTED_JOB_ENV] == "far-t1"
    # the redacted file plus the environment gives the job back the real config
    again = load_config(sub.config_file, ["cluster.scheduler=local"], environ=sub.env)
    assert again.storage.options["secret"] == SECRET


def test_python_and_workdir_of_the_kinds_section_are_used(faraway: Any, tmp_path: Path) -> None:
    faraway.cluster.scheduler = KIND

    class Section:
        python = "/opt/venv/bin/python"
        workdir = str(tmp_path)

    object.__setattr__(faraway.cluster, KIND, Section())
    sub = build_submission(faraway)
    assert sub.argv[0] == "/opt/venv/bin/python" and sub.cwd == str(tmp_path)


def test_a_relative_run_dir_is_refused_naming_the_shared_filesystem(faraway: Any) -> None:
    faraway.experiment.run_dir = "runs/x"
    with pytest.raises(SchedulerError, match="absolute path .* share"):
        build_submission(faraway)


def _run(cfg: Any, monkeypatch: pytest.MonkeyPatch, **env: str) -> tuple[int, str, str]:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    code = submit_and_follow(cfg, out=out, err=err, poll_s=0.1)
    return code, out.getvalue(), err.getvalue()


def test_a_job_that_succeeds_is_relayed_and_its_summary_printed(faraway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = _run(faraway, monkeypatch, FAKE_JOB_LINES="5", FAKE_JOB_EXIT="0")
    assert code == 0, err
    assert FarawayScheduler.preflights == ["far"]
    for i in range(5):
        assert out.count(f"fake job line {i}\n") == 1, out  # every line once, in order
    assert out.index("fake job line 0") < out.index("fake job line 4")
    assert "loaded config: secret ok" in out
    assert '"reward_after": 0.9' in out or "reward_after" in out
    assert "job far-t1 succeeded" in out
    assert "submitted job far-t1" in err and SECRET not in out + err
    argv, env, _ = FarawayJobs.submitted[0]
    assert argv[2:5] == ["areal_tasks.cli", "train", "--config"] and SECRET not in " ".join(argv)
    assert SECRET in env["AREAL_CONFIG_SECRETS"]


def test_a_failed_job_exits_1_with_its_reason(faraway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = _run(faraway, monkeypatch, FAKE_JOB_LINES="2", FAKE_JOB_EXIT="3")
    assert code == 1
    assert "job far-t1 failed: exited with code 3" in err
    assert "fake job line 1\n" in out


def test_detach_prints_the_job_and_returns(faraway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_JOB_LINES", "1")
    out, err = io.StringIO(), io.StringIO()
    assert submit_and_follow(faraway, detach=True, out=out, err=err) == 0
    assert out.getvalue() == "far-t1\n"
    backend = job_backend_for(faraway)
    deadline = time.monotonic() + 60
    while backend.status("far-t1").state == "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert backend.status("far-t1").state == "succeeded"


def test_the_preflight_stops_the_submission(faraway: Any) -> None:
    faraway.cluster.nodes = 2
    with pytest.raises(SchedulerError, match="1 node alive"):
        submit_and_follow(faraway, out=io.StringIO(), err=io.StringIO())
    assert FarawayJobs.submitted == []


def test_sigterm_while_following_cancels_the_job_and_exits_130(faraway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_JOB_LINES", "1")
    monkeypatch.setenv("FAKE_JOB_HANG", "1")
    backend = job_backend_for(faraway)
    first_line = threading.Event()

    def signal_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if "fake job line 0" in backend.log_tail("far-t1", 5):
                first_line.set()
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=signal_when_running, daemon=True)
    thread.start()
    out, err = io.StringIO(), io.StringIO()
    code = submit_and_follow(faraway, out=out, err=err, poll_s=0.1)
    thread.join(5)
    assert first_line.is_set()
    assert code == 130, err.getvalue()
    assert "cancelling job far-t1" in err.getvalue()
    assert backend.status("far-t1").state == "cancelled"


def test_the_cli_submits_when_the_kind_cannot_run_here(faraway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``areal train`` itself takes the outside path (the kind is switched after load_config)."""
    from areal_tasks.cli import train_cmd

    real_load = load_config

    def load(path: Any, overrides: Any = ()) -> Any:
        cfg = real_load(path, overrides)
        cfg.cluster.scheduler = KIND
        return cfg

    monkeypatch.setattr("areal_tasks.config.load_config", load)
    monkeypatch.setattr("areal_tasks.launch.follow.POLL_S", 0.1)
    monkeypatch.setenv("FAKE_JOB_LINES", "1")
    run_dir = faraway.experiment.run_dir
    args = train_cmd.argparse.Namespace(
        config=None,
        overrides=[f"experiment.run_dir={run_dir}", "experiment.name=far", "experiment.trial=t1"],
        detach=False,
    )
    assert train_cmd.run_train_cmd(args) == 0
    assert len(FarawayJobs.submitted) == 1
    # a submitted job that finds itself outside again refuses instead of submitting another
    monkeypatch.setenv(SUBMITTED_JOB_ENV, "far-t1")
    with pytest.raises(SchedulerError, match="this is job far-t1, submitted by areal train"):
        train_cmd.run_train_cmd(args)
    assert len(FarawayJobs.submitted) == 1


class _TailOnly:
    """A backend seen only through status and log_tail (like Ray's): the log is not a local file."""

    def __init__(self, chunks: list[str], states: list[str]) -> None:
        self.chunks, self.states, self.cancelled = chunks, states, False

    def _pop(self) -> None:
        if len(self.states) > 1:
            self.states.pop(0)
            self.chunks.pop(0)

    def submit(self, *args: Any, **kwargs: Any) -> JobStatus:
        raise NotImplementedError

    def status(self, name: str) -> JobStatus:
        state = self.states[0]
        status = JobStatus(name, state, "exited with code 0" if state == "succeeded" else state, attempt=1)  # type: ignore[arg-type]
        return status

    def cancel(self, name: str, grace_s: float = 30.0) -> JobStatus:
        self.cancelled = True
        return JobStatus(name, "cancelled", "cancelled")

    def log_tail(self, name: str, n: int = 40) -> str:
        text = self.chunks[0]
        self._pop()
        return "\n".join(text.splitlines()[-n:])


def test_follow_diffs_log_tails_when_the_log_is_not_a_local_file() -> None:
    backend = _TailOnly(
        ["a\nb\npart", "a\nb\npartial done\nc\nd", "c\nd\ne\nf", "c\nd\ne\nf"],
        ["running", "running", "running", "succeeded"],
    )
    assert isinstance(backend, JobBackend)
    out = io.StringIO()
    assert follow(backend, "j", poll_s=0.0, out=out, err=io.StringIO()) == 0
    assert out.getvalue().splitlines()[:6] == ["a", "b", "partial done", "c", "d", "e"]
    assert "f" in out.getvalue().splitlines()


def test_new_lines_finds_the_overlap() -> None:
    assert new_lines([], ["a", "b"]) == ["a", "b"]
    assert new_lines(["a", "b", "c"], ["b", "c", "d"]) == ["d"]
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines(["a", "b"], ["x", "y"]) == ["x", "y"]  # more than a window was written


def test_the_summary_is_printed_as_json_when_it_is_not_an_rl_summary(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 3}))
    backend = _TailOnly(["done"], ["succeeded"])
    out = io.StringIO()
    assert follow(backend, "j", run_dir=str(tmp_path), poll_s=0.0, out=out, err=io.StringIO()) == 0
    assert '"steps": 3' in out.getvalue()
