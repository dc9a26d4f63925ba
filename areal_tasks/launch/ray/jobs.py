"""Detached, named jobs on a Ray cluster through the Jobs REST API (no ``ray`` import).

:class:`RayJobs` is the ``ray`` :class:`~areal_tasks.api.jobs.JobBackend`: Airflow (or ``areal
train`` on a login node) submits the job's command to the cluster's dashboard, and a later try finds
it again by name. The Jobs API never reuses a ``submission_id``, not even after the job stopped or
failed, so every submission of a name is a new attempt with ``submission_id = "<name>--<attempt>"``
and ``metadata = {"areal_job": name, "attempt": k, "run_dir": ...}``; :meth:`RayJobs.status` lists
the jobs and takes the newest attempt of the name.

* ``submit`` refuses while the newest attempt is PENDING or RUNNING; the entrypoint is
  ``cd <cwd> && exec <argv>`` (the entrypoint starts in the raylet's directory) and reserves no CPU.
* ``env`` goes in ``runtime_env.env_vars``: the only way to give a Ray job variables. **Anyone who can
  reach the dashboard reads them** (``GET /api/jobs/``), so pass only what the job needs, and run the
  cluster with ``RAY_AUTH_MODE=token`` (then give the token here). Without a token a warning says so.
  Logs and statuses here never contain the values.
* States: PENDING and RUNNING are ``running``, SUCCEEDED ``succeeded``, FAILED ``failed`` (the
  driver's exit code and the last lines of Ray's message), STOPPED ``cancelled``; no job ``missing``.
* ``cancel`` asks Ray to stop the job (SIGTERM to the entrypoint's tree; SIGKILL after the cluster's
  ``RAY_JOB_STOP_WAIT_TIME_S``) and waits until it is terminal.
"""

from __future__ import annotations

import logging
import shlex
import time
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from areal_tasks.api.jobs import JobState, JobStatus
from areal_tasks.errors import SchedulerError
from areal_tasks.launch.jobs import validate_job_name
from areal_tasks.launch.ray.rest import RayDashboard
from storage.redact import redact_argv

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["RayJobs", "job_state", "submission_id"]

#: Ray job status -> our state.
_STATES: dict[str, JobState] = {
    "PENDING": "running",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "cancelled",
}
#: lines of Ray's failure message kept in a failed job's reason.
REASON_LINES = 5
_POLL_S = 0.5


def submission_id(name: str, attempt: int) -> str:
    """The Ray submission id of attempt ``attempt`` of job ``name``: ``<name>--<attempt>``."""
    return f"{name}--{attempt}"


def job_state(ray_status: str) -> JobState:
    """Our state for a Ray job status (an unknown one counts as running: it has not ended)."""
    return _STATES.get(str(ray_status).upper(), "running")


class RayJobs:
    """Submit, look up, cancel and read the log of named jobs on one Ray cluster's Jobs API.

    Args:
        dashboard_url: the dashboard (``http://head:8265``); None = ``$RAY_API_SERVER_ADDRESS``, else
            ``http://127.0.0.1:8265``.
        token: bearer token of a cluster run with ``RAY_AUTH_MODE=token`` (the Airflow connection's password).
        request_timeout_s: timeout of every HTTP call.
        stop_wait_s: how long ``cancel`` waits beyond ``grace_s`` (the cluster's SIGTERM -> SIGKILL grace).
        workdir: the default working directory of a job as the head sees it (``cwd`` overrides it).
    """

    backend = "ray"

    def __init__(
        self,
        dashboard_url: str | None = None,
        *,
        token: str | None = None,
        request_timeout_s: float = 30.0,
        stop_wait_s: float = 30.0,
        workdir: str | None = None,
    ) -> None:
        self.dashboard = RayDashboard(dashboard_url, token=token, timeout_s=request_timeout_s)
        self.stop_wait_s = stop_wait_s
        self.workdir = workdir

    @classmethod
    def from_config(cls, cfg: JobConfig) -> RayJobs:
        """The backend of a job: ``cluster.ray.dashboard_url`` (else the environment's, else loopback)."""
        ray_cfg = cfg.cluster.ray
        return cls(ray_cfg.dashboard_url, workdir=ray_cfg.workdir)

    @property
    def url(self) -> str:
        return self.dashboard.url

    # -- JobBackend ----------------------------------------------------------------------------

    def submit(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        run_dir: str | None = None,
        *,
        cwd: str | None = None,
    ) -> JobStatus:
        validate_job_name(name)
        if not argv:
            raise SchedulerError(f"job {name!r}: empty command")
        jobs = self._jobs_of(name)
        newest = jobs[-1] if jobs else None
        if newest is not None and job_state(newest.get("status", "")) == "running":
            current = self._status_of(name, newest)
            raise SchedulerError(
                f"job {name!r} is already running ({current.handle}, attempt {current.attempt}); cancel it first "
                "or wait for it to end"
            )
        attempt = (_attempt(newest) if newest is not None else 0) + 1
        sid = submission_id(name, attempt)
        workdir = cwd or self.workdir
        command = shlex.join(argv)
        entrypoint = f"cd {shlex.quote(workdir)} && exec {command}" if workdir else f"exec {command}"
        env_vars = {str(k): str(v) for k, v in (env or {}).items()}
        if env_vars and not self.dashboard.token:
            logger.warning(
                "job %s: %d environment variable(s) (%s) go to the Ray cluster without a token: anyone who can reach "
                "%s reads them through GET /api/jobs/; run the cluster with RAY_AUTH_MODE=token and set the token",
                name,
                len(env_vars),
                ", ".join(sorted(env_vars)),
                self.url,
            )
        body: dict[str, Any] = {
            "entrypoint": entrypoint,
            "submission_id": sid,
            "entrypoint_num_cpus": 0,
            "metadata": {"areal_job": name, "attempt": str(attempt), "run_dir": run_dir or ""},
        }
        if env_vars:
            body["runtime_env"] = {"env_vars": env_vars}
        self.dashboard.post("/api/jobs/", body)
        logger.info(
            "submitted ray job %s (attempt %d of %s) to %s: %s",
            sid,
            attempt,
            name,
            self.url,
            shlex.join(redact_argv(argv)),
        )
        return self.status(name)

    def status(self, name: str) -> JobStatus:
        jobs = self._jobs_of(name)
        if not jobs:
            return JobStatus(name, "missing", f"no Ray job named {name!r} at {self.url}", backend=self.backend)
        return self._status_of(name, jobs[-1])

    def cancel(self, name: str, grace_s: float = 30.0) -> JobStatus:
        current = self.status(name)
        if current.terminal or current.state == "missing":
            return current
        assert current.job_id is not None
        self.dashboard.post(f"/api/jobs/{_quote(current.job_id)}/stop")
        deadline = time.monotonic() + grace_s + self.stop_wait_s
        while True:
            current = self.status(name)
            if current.terminal:
                return current
            if time.monotonic() >= deadline:
                raise SchedulerError(
                    f"ray job {current.job_id} of {name!r} still runs {grace_s + self.stop_wait_s:g}s after it was "
                    f"stopped; Ray SIGKILLs it after the cluster's RAY_JOB_STOP_WAIT_TIME_S: check `ray job status "
                    f"{current.job_id}` on the cluster"
                )
            time.sleep(_POLL_S)

    def log_tail(self, name: str, n: int = 40) -> str:
        jobs = self._jobs_of(name)
        if not jobs:
            return ""
        sid = jobs[-1]["submission_id"]
        answer = self.dashboard.get(f"/api/jobs/{_quote(sid)}/logs", missing_ok=True)
        logs = str((answer or {}).get("logs", "")) if isinstance(answer, dict) else ""
        return "\n".join(logs.splitlines()[-n:])

    # -- internals -----------------------------------------------------------------------------

    def _jobs_of(self, name: str) -> list[dict[str, Any]]:
        """Every submission of ``name``, oldest attempt first."""
        answer = self.dashboard.get("/api/jobs/")
        if not isinstance(answer, list):
            raise SchedulerError(f"unexpected answer of {self.url}/api/jobs/: {str(answer)[:300]}")
        mine = [
            job
            for job in answer
            if isinstance(job, dict)
            and (job.get("metadata") or {}).get("areal_job") == name
            and job.get("submission_id")
        ]
        return sorted(mine, key=_attempt)

    def _status_of(self, name: str, job: dict[str, Any]) -> JobStatus:
        sid = str(job["submission_id"])
        ray_status = str(job.get("status", ""))
        state = job_state(ray_status)
        code = job.get("driver_exit_code")
        if state == "failed":
            tail = "\n".join(str(job.get("message") or "").strip().splitlines()[-REASON_LINES:])
            reason = f"ray job {sid} failed (driver exit code {code}): {tail}"
        elif state == "cancelled":
            reason = f"ray job {sid} was stopped"
        else:
            reason = f"ray job {sid} is {ray_status}"
        metadata = job.get("metadata") or {}
        return JobStatus(
            name=name,
            state=state,
            reason=reason,
            run_dir=metadata.get("run_dir") or None,
            exit_code=None if code is None else int(code),
            attempt=_attempt(job),
            log_path=f"{self.url}/api/jobs/{_quote(sid)}/logs",
            job_id=sid,
            backend=self.backend,
        )


def _attempt(job: Mapping[str, Any]) -> int:
    try:
        return int((job.get("metadata") or {}).get("attempt", 0))
    except (TypeError, ValueError):
        return 0


def _quote(sid: str) -> str:
    return urllib.parse.quote(sid, safe="")
