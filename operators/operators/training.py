"""``AReaLTrainingOperator``: runs the RL job (``areal train``) as a detached job and waits for it, deferred.

The job's name is derived from the DAG id, run id and task id (and map index), never the try
number, so every try of the task sees the same job. Each try first looks the job up:

* running -> reattach: defer to :class:`~operators.triggers.training_job.TrainingJobTrigger`;
* succeeded -> return its result at once (a retry after the job finished does not train again);
* failed or cancelled -> resubmit it with ``recover.mode=auto``, so it resumes from its newest
  checkpoint in the same run directory, then defer;
* missing -> submit, then defer.

The job is ``python -m areal_tasks.cli train --config <config> <overrides> experiment.run_dir=<dir>``
with ``AREAL_MLFLOW_RUN_ID`` set when ``mlflow_run_id`` is given, so the trainer's MLflow callback
logs into the pipeline's run. Secrets never go on that command line (``ps`` shows it to every user
of the machine) nor in an error message: an override that carries one (``storage.options.secret=``,
a URL with a password, :func:`areal_tasks.config.secrets.split_secret_overrides`) and every secret
value of the resolved config go to the job's environment as ``$AREAL_CONFIG_SECRETS``, which the
job's ``load_config`` applies; the values are also registered with Airflow's secrets masker.
``execute_complete`` returns (to XCom)::

    {"job_name", "run_dir", "summary" (the job's summary.json), "checkpoints" [url...],
     "final_checkpoint", "mlflow_run_id", "reward_before", "reward_after"}

or raises :class:`~operators.exceptions.ArealAirflowError` with the reason and the log's tail.
``on_kill`` (and a deferral that outlives ``execution_timeout``) cancels the job: SIGTERM to its
whole process group, SIGKILL after ``cancel_grace_s``.

Where things go, unless given: job records under ``$AREAL_JOBS_ROOT``, else
``$AIRFLOW_HOME/areal_jobs``; the run directory ``$AREAL_RUNS_ROOT/<job name>``, else
``<jobs root>/<job name>/run``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from operators.exceptions import ArealAirflowError, ArealConfigError
from operators.triggers.training_job import TrainingJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

    from operators.hooks.cluster import ClusterHook

__all__ = ["AReaLTrainingOperator", "job_name_for", "resolve_config_path", "resolve_jobs_root"]

#: environment variable the trainer's MLflow callback reads (areal_tasks.trainer.callbacks.mlflow.RUN_ID_ENV).
JOBS_ROOT_ENV = "AREAL_JOBS_ROOT"
RUNS_ROOT_ENV = "AREAL_RUNS_ROOT"
DEFAULT_EXECUTION_TIMEOUT = timedelta(hours=24)
#: longest job name made by :func:`job_name_for` (longer ones are cut and get a hash suffix).
MAX_JOB_NAME = 150
#: longest SIGTERM grace the trigger's on_kill uses (it must finish within the triggerer's bound).
TRIGGER_CANCEL_GRACE_S = 15.0
#: log lines quoted when a job fails.
FAILURE_TAIL_LINES = 30

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def job_name_for(dag_id: str, run_id: str, task_id: str, map_index: int | None = -1) -> str:
    """The job name of a task instance: ``<dag_id>__<run_id>__<task_id>[__<map_index>]``, made safe.

    Characters outside ``[A-Za-z0-9._-]`` become ``_``; when that changed anything (run ids hold
    ``:`` and ``+``) or the name is too long, 8 hex digits of the original's SHA-1 are appended so
    that distinct task instances never share a name. The try number is never part of it.
    """
    raw = f"{dag_id}__{run_id}__{task_id}"
    if map_index is not None and map_index >= 0:
        raw += f"__{map_index}"
    safe = _UNSAFE.sub("_", raw).lstrip("._-") or "job"
    if safe != raw or len(safe) > MAX_JOB_NAME:
        digest = hashlib.sha1(raw.encode("utf-8")).hexdigest()[:8]
        safe = f"{safe[: MAX_JOB_NAME - 9]}_{digest}"
    return safe


def resolve_jobs_root(jobs_root: str | None) -> str:
    """``jobs_root``, else ``$AREAL_JOBS_ROOT``, else ``$AIRFLOW_HOME/areal_jobs`` (``~/airflow`` by default)."""
    if jobs_root:
        return str(Path(jobs_root).expanduser().absolute())
    if os.environ.get(JOBS_ROOT_ENV):
        return str(Path(os.environ[JOBS_ROOT_ENV]).expanduser().absolute())
    airflow_home = os.environ.get("AIRFLOW_HOME") or os.path.join("~", "airflow")
    return str((Path(airflow_home).expanduser() / "areal_jobs").absolute())


def resolve_config_path(config: str) -> Path:
    """``config`` as an absolute path: as given, else relative to the working directory, else to the
    repository holding ``areal_tasks`` (so ``configs/demo_grpo.yaml`` works from any directory).
    ArealConfigError when it exists nowhere."""
    import areal_tasks

    path = Path(config).expanduser()
    candidates = (
        [path] if path.is_absolute() else [Path.cwd() / path, Path(areal_tasks.__file__).resolve().parents[1] / path]
    )
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ArealConfigError(
        f"config file {config!r} not found (looked at {', '.join(str(c) for c in candidates)}); "
        "give an absolute path or one relative to the repository, e.g. configs/demo_grpo.yaml"
    )


class AReaLTrainingOperator(BaseOperator):
    """Run ``areal train`` as a detached job and wait for it in the triggerer (see the module docstring).

    :param config: job YAML (absolute, or relative to the working directory or the repository).
    :param overrides: dotted ``key=value`` overrides, e.g. ``["train.total_steps=23"]``.
    :param scheduler: cluster backend, a built kind of ``areal_tasks.launch.registry`` (``local``,
        ``ray``, ``slurm``).
    :param conn_id: the Airflow connection of the cluster hook (``areal_ray``, ``areal_slurm`` when
        None); ``local`` takes none.
    :param mlflow_run_id: MLflow run the trainer logs into (normally an upstream task's XCom).
    :param mlflow_tracking_uri: MLflow tracking URI; when None and ``mlflow_run_id`` is set, the
        :class:`~operators.hooks.mlflow.MlflowHook` resolution (connection ``areal_mlflow``, env).
    :param run_dir: the job's run directory (default: see the module docstring); an
        ``experiment.run_dir=`` among ``overrides`` takes precedence (as does ``tracking.mlflow_uri=``
        over ``mlflow_tracking_uri``).
    :param jobs_root: where job records live (default: see the module docstring).
    :param poll_interval: seconds between two looks at the job.
    :param deferrable: wait in the triggerer (True) or poll in the worker (False).
    :param cancel_grace_s: seconds between SIGTERM and SIGKILL when the job is cancelled.
    :param train_command: the command before ``--config`` (default ``[sys.executable, "-m",
        "areal_tasks.cli", "train"]``; e.g. another environment's ``areal train``).
    """

    template_fields = (
        "config",
        "overrides",
        "scheduler",
        "conn_id",
        "mlflow_run_id",
        "mlflow_tracking_uri",
        "run_dir",
        "jobs_root",
    )
    ui_color = "#c9e4f6"

    def __init__(
        self,
        *,
        config: str,
        overrides: list[str] | None = None,
        scheduler: str = "local",
        conn_id: str | None = None,
        mlflow_run_id: str | None = None,
        mlflow_tracking_uri: str | None = None,
        run_dir: str | None = None,
        jobs_root: str | None = None,
        poll_interval: float = 10.0,
        deferrable: bool = True,
        cancel_grace_s: float = 30.0,
        train_command: list[str] | None = None,
        execution_timeout: timedelta | None = DEFAULT_EXECUTION_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(execution_timeout=execution_timeout, **kwargs)
        self.config = config
        self.overrides = list(overrides or [])
        self.scheduler = scheduler
        self.conn_id = conn_id
        self.mlflow_run_id = mlflow_run_id
        self.mlflow_tracking_uri = mlflow_tracking_uri
        self.run_dir = run_dir
        self.jobs_root = jobs_root
        self.poll_interval = poll_interval
        self.deferrable = deferrable
        self.cancel_grace_s = cancel_grace_s
        self.train_command = (
            list(train_command) if train_command else [sys.executable, "-m", "areal_tasks.cli", "train"]
        )
        self._job_name: str | None = None

    # ------------------------------------------------------------------ Airflow entry points

    def execute(self, context: Context) -> dict[str, Any]:
        name = self._name(context)
        hook = self._hook()
        status = hook.get_job(name)
        if status.state == "running":
            self.log.info(
                "job %s is already running (attempt %d, %s): reattaching", name, status.attempt, status.handle
            )
        elif status.state == "succeeded":
            self.log.info("job %s already succeeded (attempt %d): not training again", name, status.attempt)
            return self._result(name, status.run_dir)
        elif status.state in ("failed", "cancelled"):
            self.log.warning(
                "job %s %s on attempt %d (%s): resubmitting with recover.mode=auto",
                name,
                status.state,
                status.attempt,
                status.reason,
            )
            self._submit(hook, name, recover=True)
        else:
            self._submit(hook, name, recover=False)
        return self._wait(context, hook, name)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger fired: the result on success, ArealAirflowError otherwise."""
        name = event.get("job_name") or self._name(context)
        self._job_name = name
        status = event.get("status")
        reason = event.get("reason", "no reason given")
        if status == "succeeded":
            self.log.info("job %s succeeded", name)
            return self._result(name, event.get("run_dir"))
        if status == "error":
            raise ArealAirflowError(
                f"lost track of training job {name}: {reason}. The job itself may still be running; the next "
                "try of this task looks it up again and reattaches (or resubmits it if it ended)"
            )
        tail = self._hook().job_log_tail(name, FAILURE_TAIL_LINES)
        raise ArealAirflowError(
            f"training job {name} {status}: {reason}\n--- last {FAILURE_TAIL_LINES} lines of "
            f"{event.get('run_dir') or 'its'} job log ---\n{tail}\n"
            "--- the next try resubmits it with recover.mode=auto, resuming from its newest checkpoint ---"
        )

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """As Airflow's, but a deferral that ran past ``execution_timeout`` also cancels the job."""
        from airflow.sdk.exceptions import TaskDeferralTimeout

        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except TaskDeferralTimeout as exc:
            name = self._name(context)
            self.log.error("job %s ran past execution_timeout=%s: cancelling it", name, self.execution_timeout)
            status = self._hook().cancel_job(name, self.cancel_grace_s)
            raise ArealAirflowError(
                f"training job {name} ran past execution_timeout={self.execution_timeout} and was cancelled "
                f"({status.state}); raise execution_timeout or shorten the run (train.total_steps)"
            ) from exc

    def on_kill(self) -> None:
        """The task was killed while its worker ran it: cancel the job and everything it started."""
        if self._job_name is None:
            self.log.info("on_kill: no job was submitted or looked up by this task yet; nothing to cancel")
            return
        status = self._hook().cancel_job(self._job_name, self.cancel_grace_s)
        self.log.info("on_kill: job %s is %s (%s)", self._job_name, status.state, status.reason)

    # ------------------------------------------------------------------ helpers

    def _name(self, context: Context) -> str:
        ti = context["ti"]
        self._job_name = job_name_for(ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1))
        return self._job_name

    def _mlflow_run_id(self) -> str | None:
        """The MLflow run id; a template that rendered an absent XCom (``"None"``, ``""``) means none."""
        value = self.mlflow_run_id
        return None if value is None or str(value).strip() in ("", "None") else str(value).strip()

    def _hook(self) -> ClusterHook:
        from operators.hooks.cluster import get_cluster_hook

        return get_cluster_hook(self.scheduler, jobs_root=resolve_jobs_root(self.jobs_root), conn_id=self._conn_id())

    def _conn_id(self) -> str | None:
        """The connection id; a template that rendered to nothing (``"None"``, ``""``) means the default."""
        value = self.conn_id
        return None if value is None or str(value).strip() in ("", "None") else str(value).strip()

    def _given(self, key: str) -> str | None:
        """The value the task's own overrides give ``key`` (the last one wins), or None."""
        values = [o.split("=", 1)[1] for o in self.overrides if o.split("=", 1)[0].strip() == key and "=" in o]
        return values[-1] if values else None

    def _run_dir(self, name: str) -> str:
        given = self._given("experiment.run_dir")
        if given:
            return str(Path(given).expanduser().absolute())
        if self.run_dir:
            return str(Path(self.run_dir).expanduser().absolute())
        if os.environ.get(RUNS_ROOT_ENV):
            return str(Path(os.environ[RUNS_ROOT_ENV]).expanduser().absolute() / name)
        return str(Path(resolve_jobs_root(self.jobs_root)) / name / "run")

    def _tracking_uri(self) -> str | None:
        from storage.redact import REDACTED

        if self.mlflow_tracking_uri and REDACTED in self.mlflow_tracking_uri:  # handed over redacted (XCom)
            from operators.hooks.mlflow import MlflowHook

            return MlflowHook(self.mlflow_tracking_uri).tracking_uri
        if self.mlflow_tracking_uri:
            return self.mlflow_tracking_uri
        if self._mlflow_run_id():
            from operators.hooks.mlflow import MlflowHook

            return MlflowHook().tracking_uri
        return None

    def _job_overrides(self, name: str, *, recover: bool) -> list[str]:
        """The overrides the job runs with: the task's, then the run dir and tracking URI unless the
        task's own overrides set them, then ``recover.mode=auto`` for a resubmission (it must win)."""
        overrides = list(self.overrides)
        if self._given("experiment.run_dir") is None:
            overrides.append(f"experiment.run_dir={self._run_dir(name)}")
        uri = None if self._given("tracking.mlflow_uri") is not None else self._tracking_uri()
        if uri:
            overrides.append(f"tracking.mlflow_uri={uri}")
        if recover:
            overrides.append("recover.mode=auto")
        return overrides

    def _load_config(self, name: str, *, recover: bool) -> tuple[Path, list[str], Any]:
        """The config path, the job's overrides and the resolved config (validated before any submission)."""
        from areal_tasks.config import load_config
        from areal_tasks.errors import ConfigError
        from storage.redact import redact_argv, redact_text

        path = resolve_config_path(self.config)
        overrides = self._job_overrides(name, recover=recover)
        try:
            cfg = load_config(path, overrides)
        except ConfigError as exc:
            raise ArealConfigError(
                f"config {path} with overrides {redact_argv(overrides)} is not valid: {redact_text(str(exc))}"
            ) from exc
        if cfg.cluster.scheduler != self.scheduler:
            self.log.warning(
                "the config says cluster.scheduler=%s; this task submits to %s", cfg.cluster.scheduler, self.scheduler
            )
        return path, overrides, cfg

    def _submit(self, hook: ClusterHook, name: str, *, recover: bool) -> None:
        from areal_tasks.api.run_dir import MLFLOW_RUN_ID_ENV
        from areal_tasks.config.secrets import secrets_env, split_secret_overrides

        path, overrides, cfg = self._load_config(name, recover=recover)
        public, secret = split_secret_overrides(overrides)
        argv = [*self.train_command, "--config", str(path), *public]
        run_id = self._mlflow_run_id()
        env = {MLFLOW_RUN_ID_ENV: run_id} if run_id else {}
        env.update(_masked(secrets_env(cfg, secret)))
        hook.size_jobs(cfg.cluster)  # e.g. a SLURM batch job asks for cluster.nodes nodes
        status = hook.submit_job(name, argv, env, cfg.experiment.run_dir, cwd=os.getcwd())
        self.log.info(
            "submitted job %s (attempt %d, %s), run dir %s, log %s",
            name,
            status.attempt,
            status.handle,
            status.run_dir,
            status.log_path,
        )

    def _wait(self, context: Context, hook: ClusterHook, name: str) -> dict[str, Any]:
        # the triggerer gives on_kill() a bounded time ([triggerer] on_kill_timeout, 30 s by default)
        trigger = TrainingJobTrigger(
            name,
            resolve_jobs_root(self.jobs_root),
            self.scheduler,
            self.poll_interval,
            min(self.cancel_grace_s, TRIGGER_CANCEL_GRACE_S),
            conn_id=self._conn_id(),
        )
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete", timeout=self.execution_timeout)
        while True:  # not deferrable: poll here, in the worker
            status = hook.get_job(name)
            if status.state != "running":
                event = {
                    "status": status.state if status.state != "missing" else "error",
                    "reason": status.reason,
                    "job_name": name,
                    "run_dir": status.run_dir,
                    "exit_code": status.exit_code,
                }
                return self.execute_complete(context, event)
            time.sleep(self.poll_interval)

    def _result(self, name: str, run_dir: str | None) -> dict[str, Any]:
        """The XCom of a succeeded job: its summary.json and its checkpoints."""
        from operators.hooks.storage import StorageHook

        _, _, cfg = self._load_config(name, recover=False)
        run_dir = run_dir or cfg.experiment.run_dir
        from areal_tasks.api.run_dir import RunPaths

        summary_path = RunPaths.of(run_dir).summary
        if not summary_path.is_file():
            raise ArealAirflowError(
                f"job {name} exited with code 0 but wrote no {summary_path}; see its log "
                f"({self._hook().job_log_tail(name, 5)!r}) and rerun the task"
            )
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        checkpoints = StorageHook(cfg.storage.url, cfg.storage.options).list_checkpoints(
            cfg.experiment.name, cfg.experiment.trial
        )
        return {
            "job_name": name,
            "run_dir": str(run_dir),
            "summary": summary,
            "checkpoints": checkpoints,
            "final_checkpoint": checkpoints[-1] if checkpoints else None,
            "mlflow_run_id": self._mlflow_run_id(),
            "reward_before": summary.get("reward_before"),
            "reward_after": summary.get("reward_after"),
        }


def _masked(env: dict[str, str]) -> dict[str, str]:
    """``env`` unchanged, after registering the secrets it carries with Airflow's masker (task logs,
    rendered fields)."""
    from airflow.sdk.log import mask_secret

    from areal_tasks.config.secrets import SECRETS_ENV
    from storage.redact import hidden_parts

    if SECRETS_ENV in env:
        values = json.loads(env[SECRETS_ENV])
        for part in hidden_parts(values) or list(values.values()):
            mask_secret(part)
    return env
