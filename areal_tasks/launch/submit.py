"""``areal train`` from outside the cluster: submit the job to the scheduler kind and follow it.

``areal train`` runs the controller itself when it may (``runs_here(cfg)``: always for ``local``; on
a Ray node or inside a SLURM job for those kinds). Otherwise, and for ``areal launch``,
:func:`submit_and_follow`:

1. runs the kind's preflight (the live checks: the cluster has the nodes, the partition exists);
2. writes the resolved config (secrets redacted) to ``<run_dir>/config.yaml``: the job reads it
   from there, so for several nodes the run directory must be on a filesystem they all share;
3. submits ``<python> -m areal_tasks.cli train --config <run_dir>/config.yaml`` as job
   ``<experiment>-<trial>`` through the kind's :class:`~areal_tasks.api.jobs.JobBackend`, with
   ``cluster.<kind>.python`` and ``cluster.<kind>.workdir`` when set; the secret values go in the
   job's environment as ``$AREAL_CONFIG_SECRETS`` (:func:`~areal_tasks.config.secrets.secrets_env`),
   never in argv or a file;
4. follows it (:func:`areal_tasks.launch.follow.follow`), unless ``detach``.

The submitted job carries ``$AREAL_SUBMITTED_JOB``; a job that finds itself outside its cluster
again refuses to submit another (see :func:`check_not_resubmitting`) instead of looping.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import IO, TYPE_CHECKING

from areal_tasks.api.run_dir import MLFLOW_RUN_ID_ENV
from areal_tasks.errors import SchedulerError

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = [
    "SUBMITTED_JOB_ENV",
    "Submission",
    "build_submission",
    "check_not_resubmitting",
    "job_name",
    "submit_and_follow",
]

#: set in the environment of a job ``areal train`` submitted: the job's name.
SUBMITTED_JOB_ENV = "AREAL_SUBMITTED_JOB"


@dataclasses.dataclass(frozen=True)
class Submission:
    """What is handed to ``JobBackend.submit``. ``env`` holds secrets: never print or record it."""

    kind: str
    name: str
    argv: list[str]
    env: dict[str, str]
    run_dir: str
    cwd: str
    config_file: str

    def describe(self) -> str:
        """One line for people: the command and the names (only) of the environment variables."""
        return f"{' '.join(self.argv)} (cwd {self.cwd}; environment: {', '.join(sorted(self.env)) or 'none'})"


def job_name(cfg: JobConfig) -> str:
    """The job's name on every backend: ``<experiment>-<trial>`` (what Airflow and a retry look up)."""
    from areal_tasks.launch.jobs import validate_job_name

    return validate_job_name(f"{cfg.experiment.name}-{cfg.experiment.trial}")


def check_not_resubmitting(cfg: JobConfig) -> None:
    """SchedulerError when this process is a job ``areal train`` submitted and yet its scheduler says it
    is outside the cluster: submitting again would start a new job from every job, without end."""
    submitted = os.environ.get(SUBMITTED_JOB_ENV)
    if submitted:
        raise SchedulerError(
            f"this is job {submitted}, submitted by areal train to the {cfg.cluster.scheduler} scheduler, but "
            f"that scheduler says this process is not inside its cluster, so it cannot run the controller; "
            f"check the job's environment on the node (the {cfg.cluster.scheduler} backend sets what "
            "can_run_controller_here looks for), or unset AREAL_SUBMITTED_JOB to submit from here on purpose"
        )


def build_submission(cfg: JobConfig) -> Submission:
    """Write the resolved config into the run directory and build the job's command and environment."""
    from areal_tasks.config.secrets import secrets_env
    from areal_tasks.config.serialize import write_resolved

    kind = cfg.cluster.scheduler
    run_dir = cfg.experiment.run_dir
    if not run_dir or not os.path.isabs(run_dir):
        raise SchedulerError(
            f"experiment.run_dir must be an absolute path that the {kind} nodes can read (the job loads its "
            f"config from there; for several nodes a filesystem they all share), got {run_dir!r}"
        )
    section = getattr(cfg.cluster, kind, None)
    python = getattr(section, "python", None) or sys.executable
    cwd = getattr(section, "workdir", None) or os.getcwd()
    config_file = str(write_resolved(cfg))
    name = job_name(cfg)
    argv = [python, "-m", "areal_tasks.cli", "train", "--config", config_file]
    env = {**secrets_env(cfg), SUBMITTED_JOB_ENV: name}
    if os.environ.get(MLFLOW_RUN_ID_ENV):
        env[MLFLOW_RUN_ID_ENV] = os.environ[MLFLOW_RUN_ID_ENV]
    if cfg.cluster.nodes > 1:
        logger.info(
            "%d nodes: %s (run dir) and the storage must be shared by every node; the storage probe checks them",
            cfg.cluster.nodes,
            run_dir,
        )
    return Submission(kind, name, argv, env, run_dir, str(cwd), config_file)


def submit_and_follow(
    cfg: JobConfig,
    *,
    detach: bool = False,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
    poll_s: float | None = None,
) -> int:
    """Preflight, submit and (unless ``detach``) follow the job of ``cfg``; return the exit code."""
    from areal_tasks.launch.follow import POLL_S, follow
    from areal_tasks.launch.registry import job_backend_for, preflight_for

    out = out or sys.stdout
    err = err or sys.stderr
    kind = cfg.cluster.scheduler
    report = preflight_for(cfg)
    err.write(f"preflight ({kind}): {_short(report)}\n")
    backend = job_backend_for(cfg)
    submission = build_submission(cfg)
    logger.info("submitting job %s to %s: %s", submission.name, kind, submission.describe())
    status = backend.submit(submission.name, submission.argv, submission.env, submission.run_dir, cwd=submission.cwd)
    err.write(
        f"submitted job {status.name} to {kind} ({status.handle}, attempt {status.attempt}); "
        f"run dir {submission.run_dir}" + (f"; log {status.log_path}" if status.log_path else "") + "\n"
    )
    err.flush()
    if detach:
        out.write(f"{status.name}\n")
        return 0
    return follow(backend, submission.name, run_dir=submission.run_dir, poll_s=poll_s or POLL_S, out=out, err=err)


def _short(report: dict[str, object]) -> str:
    """The preflight report on one line (warnings are logged by the preflight itself)."""
    shown = {k: v for k, v in report.items() if k not in ("warnings", "problems") and v not in (None, [], {})}
    return ", ".join(f"{k}={v}" for k, v in shown.items())
