"""RayJobs and the Ray preflight against a tiny fake Jobs API on 127.0.0.1 (no Ray needed).

The fake keeps jobs in a dict and answers like Ray 2.60 does where it matters: a reused
``submission_id`` is HTTP 500 ("already exists"), an unknown id is 404, and ``GET /api/jobs/``
returns every job with its ``runtime_env`` (env vars in clear) and metadata. The tests pin the
submission ids (``<name>--<attempt>``), lookup by metadata (newest attempt), the state mapping,
the refusal while running, the bearer token, the warning without one, and that no status, reason or
log line of ours carries an env value.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from areal_tasks.errors import SchedulerError
from areal_tasks.launch.ray import preflight
from areal_tasks.launch.ray.jobs import RayJobs, job_state, submission_id
from areal_tasks.launch.ray.rest import RayDashboard, dashboard_url


class FakeRay:
    """State of the fake dashboard: jobs by submission id, nodes, and the requests seen."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.nodes = [
            {"node_ip": "10.0.0.10", "state": "ALIVE", "is_head_node": True, "resources_total": {"CPU": 4.0}},
            {"node_ip": "10.0.0.11", "state": "ALIVE", "is_head_node": False, "resources_total": {"CPU": 4.0}},
            {"node_ip": "10.0.0.12", "state": "DEAD", "is_head_node": False, "resources_total": {"CPU": 8.0}},
        ]
        self.auth: list[str | None] = []
        self.stop_to = "STOPPED"


def _handler(state: FakeRay) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode() if not isinstance(body, str) else body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            state.auth.append(self.headers.get("Authorization"))
            if self.path == "/api/jobs/":
                return self._send(200, list(state.jobs.values()))
            if self.path.startswith("/api/v0/nodes"):
                return self._send(200, {"result": True, "data": {"result": {"result": state.nodes}}})
            if self.path == "/api/version":
                return self._send(200, {"ray_version": "2.60.0"})
            parts = self.path.strip("/").split("/")
            if len(parts) >= 3 and parts[:2] == ["api", "jobs"]:
                job = state.jobs.get(parts[2])
                if job is None:
                    return self._send(404, "Job does not exist")
                if parts[3:] == ["logs"]:
                    return self._send(200, {"logs": "".join(f"line {i}\n" for i in range(100))})
                return self._send(200, job)
            return self._send(404, "no such route")

        def do_POST(self) -> None:
            state.auth.append(self.headers.get("Authorization"))
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/api/jobs/":
                sid = body["submission_id"]
                if sid in state.jobs:
                    return self._send(500, f"Job with submission_id {sid} already exists.")
                state.jobs[sid] = {
                    "type": "SUBMISSION",
                    "submission_id": sid,
                    "status": "PENDING",
                    "entrypoint": body["entrypoint"],
                    "message": "",
                    "metadata": body.get("metadata"),
                    "runtime_env": body.get("runtime_env"),
                    "entrypoint_num_cpus": body.get("entrypoint_num_cpus"),
                    "driver_exit_code": None,
                }
                return self._send(200, {"job_id": None, "submission_id": sid})
            parts = self.path.strip("/").split("/")
            if len(parts) == 4 and parts[3] == "stop" and parts[2] in state.jobs:
                state.jobs[parts[2]]["status"] = state.stop_to
                return self._send(200, {"stopped": True})
            return self._send(404, "no such route")

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def fake() -> Iterator[tuple[FakeRay, str]]:
    state = FakeRay()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _finish(state: FakeRay, sid: str, status: str, code: int | None = None, message: str = "") -> None:
    state.jobs[sid].update(status=status, driver_exit_code=code, message=message)


@pytest.mark.parametrize(
    ("ray_status", "state"),
    [
        ("PENDING", "running"),
        ("RUNNING", "running"),
        ("SUCCEEDED", "succeeded"),
        ("FAILED", "failed"),
        ("STOPPED", "cancelled"),
        ("SOMETHING_NEW", "running"),
    ],
)
def test_state_mapping(ray_status: str, state: str) -> None:
    assert job_state(ray_status) == state


def test_submission_ids_are_name_and_attempt() -> None:
    assert submission_id("exp-trial", 1) == "exp-trial--1"
    assert submission_id("exp-trial", 12) == "exp-trial--12"


def test_submit_lookup_attempts_and_refusal(fake: tuple[FakeRay, str]) -> None:
    state, url = fake
    jobs = RayJobs(url, request_timeout_s=5)
    assert jobs.status("exp-t").state == "missing"
    first = jobs.submit("exp-t", ["python", "-m", "areal_tasks.cli", "train"], run_dir="/runs/e/t", cwd="/srv/proj")
    assert (first.state, first.attempt, first.job_id, first.backend) == ("running", 1, "exp-t--1", "ray")
    assert first.run_dir == "/runs/e/t"
    sent = state.jobs["exp-t--1"]
    assert sent["entrypoint"] == "cd /srv/proj && exec python -m areal_tasks.cli train"
    assert sent["metadata"] == {"areal_job": "exp-t", "attempt": "1", "run_dir": "/runs/e/t"}
    assert sent["entrypoint_num_cpus"] == 0 and sent["runtime_env"] is None
    with pytest.raises(SchedulerError, match=r"'exp-t' is already running \(ray job exp-t--1, attempt 1\)"):
        jobs.submit("exp-t", ["true"])
    _finish(state, "exp-t--1", "FAILED", 3, "\n".join(f"log {i}" for i in range(20)) + "\nValueError: boom")
    failed = jobs.status("exp-t")
    assert (failed.state, failed.exit_code) == ("failed", 3)
    assert "ValueError: boom" in failed.reason and "log 14" not in failed.reason
    second = jobs.submit("exp-t", ["true"])  # a new id: Ray never reuses one
    assert (second.attempt, second.job_id) == (2, "exp-t--2")
    _finish(state, "exp-t--2", "SUCCEEDED", 0)
    assert jobs.status("exp-t").state == "succeeded"
    assert jobs.status("exp-t").attempt == 2
    assert jobs.status("other").state == "missing"  # another name's jobs are not this one's


def test_newest_attempt_wins_even_past_nine(fake: tuple[FakeRay, str]) -> None:
    state, url = fake
    jobs = RayJobs(url)
    for attempt in range(1, 12):
        jobs.submit("n", ["true"])
        _finish(state, submission_id("n", attempt), "FAILED", 1)
    assert jobs.status("n").attempt == 11


def test_cancel_stops_and_waits_until_terminal(fake: tuple[FakeRay, str]) -> None:
    state, url = fake
    jobs = RayJobs(url, stop_wait_s=1)
    jobs.submit("c", ["sleep", "100"])
    done = jobs.cancel("c", grace_s=1)
    assert done.state == "cancelled" and "stopped" in done.reason
    assert jobs.cancel("c").state == "cancelled"  # already terminal: unchanged
    assert jobs.cancel("never").state == "missing"
    state.stop_to = "RUNNING"  # a job that does not stop
    jobs.submit("c", ["sleep", "100"])
    with pytest.raises(SchedulerError, match="RAY_JOB_STOP_WAIT_TIME_S"):
        jobs.cancel("c", grace_s=0.1)


def test_log_tail(fake: tuple[FakeRay, str]) -> None:
    _, url = fake
    jobs = RayJobs(url)
    assert jobs.log_tail("x") == ""
    jobs.submit("x", ["true"])
    assert jobs.log_tail("x", 3) == "line 97\nline 98\nline 99"


def test_env_reaches_the_job_only_and_a_missing_token_is_warned_about(
    fake: tuple[FakeRay, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, url = fake
    secret = "s3cr3t-value-123"
    jobs = RayJobs(url)
    with caplog.at_level(logging.INFO, logger="areal_tasks.launch.ray"):
        status = jobs.submit(
            "s", ["python", "train.py", "--api-key", "k3y-in-argv"], env={"AREAL_CONFIG_SECRETS": secret}
        )
    assert state.jobs["s--1"]["runtime_env"] == {"env_vars": {"AREAL_CONFIG_SECRETS": secret}}
    assert "without a token" in caplog.text and "AREAL_CONFIG_SECRETS" in caplog.text
    assert secret not in caplog.text and "k3y-in-argv" not in caplog.text  # argv is logged redacted
    assert secret not in json.dumps(status.to_dict()) and secret not in json.dumps(jobs.status("s").to_dict())
    assert state.auth and all(header is None for header in state.auth)


def test_a_token_is_sent_as_bearer_and_silences_the_warning(
    fake: tuple[FakeRay, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, url = fake
    jobs = RayJobs(url, token="tok-1")
    with caplog.at_level(logging.WARNING, logger="areal_tasks.launch.ray"):
        jobs.submit("t", ["true"], env={"A": "b"})
    assert "without a token" not in caplog.text
    assert state.auth and set(state.auth) == {"Bearer tok-1"}


def test_unreachable_dashboard_names_the_url_and_the_fix() -> None:
    with pytest.raises(SchedulerError, match=r"http://127\.0\.0\.1:9/api/jobs/ is unreachable .*include-dashboard"):
        RayJobs("http://127.0.0.1:9", request_timeout_s=2).status("x")


def test_dashboard_url_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    assert dashboard_url() == "http://127.0.0.1:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://head:8265/")
    assert dashboard_url() == "http://head:8265"
    assert dashboard_url("http://other:1") == "http://other:1"


def test_preflight_counts_alive_nodes_and_names_what_is_short(fake: tuple[FakeRay, str]) -> None:
    _, url = fake
    board = RayDashboard(url)
    report = preflight.check_resources(board, nodes=2)
    assert report["fit"] == 2 and report["ray_version"] == "2.60.0"
    with pytest.raises(SchedulerError, match=r"has 2 alive node\(s\) .*asks for 3 .*10\.0\.0\.11"):
        preflight.check_resources(board, nodes=3)
    with pytest.raises(SchedulerError, match=r"has 0 alive node\(s\) with >= 1 CPU and >= 1 GPU"):
        preflight.check_resources(board, nodes=1, gpus_per_node=1)
    with pytest.raises(SchedulerError, match=r">= 8 CPU"):
        preflight.check_resources(board, nodes=1, cpus_per_node=8)


def test_the_jobs_client_and_the_hook_import_neither_ray_nor_torch() -> None:
    """Airflow workers, triggerers and login nodes use them without ray installed (and without torch)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import areal_tasks.launch.ray.jobs, areal_tasks.launch.ray.preflight\n"
        "from operators.hooks.ray_cluster import RayClusterHook\n"
        "RayClusterHook().get_conn()\n"
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr
