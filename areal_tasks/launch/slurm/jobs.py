"""Detached, named jobs on SLURM: one ``sbatch`` batch job per attempt, found again by name.

:class:`SlurmJobs` keeps the same folders as :class:`~areal_tasks.launch.jobs.LocalJobs`::

    <root>/<name>/attempt_<k>/job.sbatch   the batch script (no secrets; see .script)
                              job.json     SLURM job id, argv (redacted), env *names*, run dir
                              job.log      the job's output (sbatch --output, appended)
                              exit_code    written by the script's EXIT trap, atomically
                              cancelled    written by cancel() before it signals the job

folders 0700 and files 0600, and a copy of the script at ``<run_dir>/slurm/attempt_<k>.sbatch`` (the
script is "readable and kept in the run directory"). The job's environment (secrets included)
reaches it through ``sbatch``'s own environment (``--export=ALL``), never the script or a record.

``status`` asks, in order: ``squeue --states=all`` by name (the row of the recorded job id),
``scontrol show job``, ``sacct`` (only while accounting is on: it is off without slurmdbd), the
attempt's ``exit_code`` file (the jobs root is shared with the batch host), and otherwise reports
that SLURM no longer knows the job (it forgets ended jobs after ``MinJobAge``). SLURM's states map to
``running`` (PENDING, CONFIGURING, RUNNING, COMPLETING, SUSPENDED, with SLURM's reason),
``succeeded`` (COMPLETED), ``cancelled`` (CANCELLED, or any failed end after cancel()) and ``failed``
(FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, PREEMPTED: with the exit code and
the last log lines).

``cancel`` writes the marker, sends SIGTERM to every process of the job (``scancel --signal=TERM
--full``: the controller stops its steps; the script's TERM trap keeps the shell waiting for it),
waits ``grace_s``, then ``scancel``s the job (SIGTERM, SIGKILL after SLURM's ``KillWait``) and waits
for an end state, bounded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.jobs import JobState, JobStatus
from areal_tasks.config.cluster import ClusterConfig
from areal_tasks.errors import SchedulerError
from areal_tasks.launch import job_folders
from areal_tasks.launch.jobs import JOBS_ROOT_ENV, validate_job_name
from areal_tasks.launch.process import read_log_tail
from areal_tasks.launch.slurm.commands import parse_key_values, parse_rows, resolve_slurm_conf, run_slurm
from areal_tasks.launch.slurm.script import EXIT_FILE, LOG_FILE, BatchScript, render_batch_script
from storage.redact import redact_argv

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["SlurmJobs", "map_state"]

SCRIPT_FILE = "job.sbatch"
#: log lines quoted in the reason of a failed job.
REASON_TAIL_LINES = 5
#: seconds cancel() waits for an end state after ``scancel`` (SLURM's KillWait plus a margin).
CANCEL_WAIT_S = 45.0

RUNNING_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
FAILED_STATES = frozenset(
    {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED", "SPECIAL_EXIT"}
)
_WHY = {
    "NODE_FAIL": "a node of the job was lost (SLURM does not requeue it: the retry resumes from the last checkpoint)",
    "TIMEOUT": "it reached its time limit (cluster.slurm.time_limit or the partition's)",
    "OUT_OF_MEMORY": "it ran out of memory (raise cluster.memory_gb_per_node)",
    "PREEMPTED": "it was preempted by a job of higher priority",
    "DEADLINE": "it could not finish before its deadline",
    "BOOT_FAIL": "a node failed to boot",
}


def map_state(slurm_state: str, cancelled: bool) -> JobState:
    """The :data:`JobState` of a SLURM job state (``CANCELLED by 0`` counts as CANCELLED)."""
    state = slurm_state.split()[0].rstrip("+") if slurm_state else ""
    if state in RUNNING_STATES:
        return "running"
    if state == "COMPLETED":
        return "succeeded"
    if state == "CANCELLED" or cancelled:
        return "cancelled"
    return "failed"


def _exit_code(text: str) -> int | None:
    """``ExitCode=7:0`` -> 7; ``0:15`` (killed by signal 15) -> 143; None when unreadable."""
    match = re.match(r"^(\d+):(\d+)$", text or "")
    if match is None:
        return None
    code, sig = int(match.group(1)), int(match.group(2))
    return 128 + sig if sig else code


class SlurmJobs:
    """Named detached jobs as SLURM batch jobs, recorded under ``root`` (see the module docstring).

    ``cluster`` gives the job's shape (nodes, GPUs, CPUs and memory per node) and ``cluster.slurm``
    the rest (partition, account, qos, time limit, setup lines, python, workdir, slurm.conf).
    """

    def __init__(self, root: str | os.PathLike[str], cluster: ClusterConfig | None = None, *, label: str = "") -> None:
        self.root = Path(root).expanduser().absolute()
        self.cluster = cluster or ClusterConfig(scheduler="slurm")
        self.slurm = self.cluster.slurm
        self.slurm_conf = resolve_slurm_conf(self.slurm.slurm_conf)
        self.label = label
        self._accounting: bool | None = None  # unknown until sacct has been asked once

    @classmethod
    def from_config(cls, cfg: JobConfig) -> SlurmJobs:
        """Records under ``$AREAL_JOBS_ROOT``, else ``<parent of the run dir>/jobs``; shape from ``cfg.cluster``."""
        root = os.environ.get(JOBS_ROOT_ENV)
        if not root:
            run_dir = Path(cfg.experiment.run_dir or Path("runs") / cfg.experiment.name / cfg.experiment.trial)
            root = str(run_dir.absolute().parent / "jobs")
        return cls(root, cfg.cluster, label=f"{cfg.experiment.name}/{cfg.experiment.trial}")

    # ------------------------------------------------------------------ public API

    def submit(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
    ) -> JobStatus:
        """Write the batch script of the next attempt of ``name`` and ``sbatch`` it; its status.

        Refused (SchedulerError) while the newest attempt is pending or running, and for a command
        line that shows a secret (pass secrets in ``env``).
        """
        validate_job_name(name)
        if not argv:
            raise SchedulerError(f"job {name}: argv is empty; give the command to run")
        command = list(argv)
        if self.slurm.python and command[0] == sys.executable:
            command[0] = self.slurm.python  # the interpreter as the nodes see it
        with job_folders.locked_job_dir(self._job_dir(name)):
            current = self._latest_attempt(name)
            if current is not None:
                status = self._status_of(name, current)
                if status.state == "running":
                    raise SchedulerError(
                        f"job {name} is already running (SLURM job {status.job_id}, attempt {status.attempt}: "
                        f"{status.reason}); look it up and wait for it, or cancel it before submitting again"
                    )
            attempt = self._next_attempt(name)
            folder = self._job_dir(name) / f"{job_folders.ATTEMPT_PREFIX}{attempt}"
            folder.mkdir(mode=job_folders.DIR_MODE)
            os.chmod(folder, job_folders.DIR_MODE)
            workdir = str(cwd or self.slurm.workdir or os.getcwd())
            script = render_batch_script(
                BatchScript(
                    name=name,
                    attempt=attempt,
                    attempt_dir=folder,
                    command=command,
                    workdir=workdir,
                    nodes=self.cluster.nodes,
                    gpus_per_node=self.cluster.gpus_per_node,
                    cpus_per_node=self.cluster.cpus_per_node,
                    memory_gb_per_node=self.cluster.memory_gb_per_node,
                    slurm=self.slurm,
                    label=self.label,
                )
            )
            script_path = folder / SCRIPT_FILE
            _write_private(script_path, script)
            _write_private(folder / LOG_FILE, "")  # sbatch appends to it: created 0600 here, not by SLURM's umask
            kept = None
            if run_dir is not None:
                kept = Path(run_dir) / "slurm" / f"{job_folders.ATTEMPT_PREFIX}{attempt}.sbatch"
                kept.parent.mkdir(parents=True, exist_ok=True)
                _write_private(kept, script)
            done = run_slurm(
                ["sbatch", "--parsable", "--export=ALL", str(script_path)],
                slurm_conf=self.slurm_conf,
                env={**dict(env or {}), "PYTHONUNBUFFERED": "1"},
            )
            job_id = done.stdout.strip().split(";")[0]
            if not job_id.isdigit():
                raise SchedulerError(
                    f"job {name}: sbatch printed {done.stdout!r}, not a job id ({done.stderr.strip()})"
                )
            record = {
                "name": name,
                "attempt": attempt,
                "job_id": job_id,
                "argv": redact_argv(command),
                "env_keys": sorted((env or {}).keys()),
                "run_dir": None if run_dir is None else str(run_dir),
                "cwd": workdir,
                "script": str(script_path),
                "script_in_run_dir": None if kept is None else str(kept),
                "slurm_conf": self.slurm_conf,
                "submitted_at": time.time(),
            }
            _write_private(folder / job_folders.RECORD_FILE, json.dumps(record, indent=1))
        logger.info("submitted job %s (attempt %d) as SLURM job %s; script %s", name, attempt, job_id, script_path)
        return self._status_of(name, folder)

    def status(self, name: str) -> JobStatus:
        """The state of the newest attempt of ``name`` (``missing`` when it was never submitted)."""
        validate_job_name(name)
        folder = self._latest_attempt(name)
        if folder is None:
            return JobStatus(name, "missing", f"no job named {name} under {self.root}", backend="slurm")
        return self._status_of(name, folder)

    def cancel(self, name: str, grace_s: float = 30.0) -> JobStatus:
        """SIGTERM every process of the job, ``scancel`` it after ``grace_s``; its status once it has ended."""
        validate_job_name(name)
        with job_folders.locked_job_dir(self._job_dir(name)):
            folder = self._latest_attempt(name)
            if folder is None:
                return JobStatus(name, "missing", f"no job named {name} under {self.root}", backend="slurm")
            status = self._status_of(name, folder)
            if status.state != "running":
                logger.info("job %s is %s; nothing to cancel", name, status.state)
                return status
            assert status.job_id is not None
            _write_private(folder / job_folders.CANCEL_FILE, f"{time.time()}\n")
            signalled = run_slurm(
                ["scancel", "--signal=TERM", "--full", status.job_id], slurm_conf=self.slurm_conf, check=False
            )
            if signalled.returncode == 0:
                status = self._wait_end(name, folder, grace_s)
            else:  # a pending job has no process to signal
                logger.info("job %s: SIGTERM not delivered (%s)", name, signalled.stderr.strip())
            if status.state == "running":
                logger.warning("job %s still running %.1fs after SIGTERM: scancel %s", name, grace_s, status.job_id)
                run_slurm(["scancel", status.job_id], slurm_conf=self.slurm_conf)
                status = self._wait_end(name, folder, CANCEL_WAIT_S)
            if status.state == "running":
                raise SchedulerError(
                    f"job {name}: SLURM job {status.job_id} still {status.reason} {CANCEL_WAIT_S:.0f}s after "
                    "scancel; look at `scontrol show job` and the nodes' slurmd logs"
                )
        return status

    def log_tail(self, name: str, n: int = 40) -> str:
        """The last ``n`` lines of the newest attempt's ``job.log`` ('' when there is none)."""
        validate_job_name(name)
        folder = self._latest_attempt(name)
        return "" if folder is None else read_log_tail(folder / LOG_FILE, n)

    # ------------------------------------------------------------------ internals

    def _wait_end(self, name: str, folder: Path, timeout: float) -> JobStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self._status_of(name, folder)
            if status.state != "running" or time.monotonic() >= deadline:
                return status
            time.sleep(0.2)

    def _job_dir(self, name: str) -> Path:
        return self.root / name

    def _attempts(self, name: str) -> list[Path]:
        folder = self._job_dir(name)
        if not folder.is_dir():
            return []
        return [p for p in folder.iterdir() if job_folders.ATTEMPT_RE.match(p.name)]

    def _latest_attempt(self, name: str) -> Path | None:
        recorded = [p for p in self._attempts(name) if (p / job_folders.RECORD_FILE).is_file()]
        return max(recorded, key=job_folders.attempt_number) if recorded else None

    def _next_attempt(self, name: str) -> int:
        return max((job_folders.attempt_number(p) for p in self._attempts(name)), default=0) + 1

    def _slurm_view(self, name: str, job_id: str) -> dict[str, str] | None:
        """``{"state", "reason", "exit"}`` of ``job_id`` from squeue, scontrol or sacct; None if SLURM forgot it."""
        queue = run_slurm(
            ["squeue", "-h", f"--name={name}", "--states=all", "-o", "%i|%T|%r"], slurm_conf=self.slurm_conf
        )
        rows = {row["id"]: row for row in parse_rows(queue.stdout, ("id", "state", "reason"))}
        row = rows.get(job_id)
        if row is not None and row["state"] in RUNNING_STATES:
            return {"state": row["state"], "reason": row["reason"], "exit": ""}
        shown = run_slurm(["scontrol", "show", "job", job_id, "-o"], slurm_conf=self.slurm_conf, check=False)
        if shown.returncode == 0 and shown.stdout.strip():
            fields = parse_key_values(shown.stdout.strip())
            return {
                "state": fields.get("JobState", ""),
                "reason": fields.get("Reason", ""),
                "exit": fields.get("ExitCode", ""),
            }
        if row is not None:
            return {"state": row["state"], "reason": row["reason"], "exit": ""}
        if self._accounting is not False:
            acct = run_slurm(
                ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode"],
                slurm_conf=self.slurm_conf,
                check=False,
            )
            if "accounting storage is disabled" in (acct.stderr + acct.stdout).lower():
                self._accounting = False
            elif acct.returncode == 0 and acct.stdout.strip():
                self._accounting = True
                found = parse_rows(acct.stdout, ("state", "exit"))[0]
                return {"state": found["state"], "reason": "", "exit": found["exit"]}
        return None

    def _status_of(self, name: str, folder: Path) -> JobStatus:
        record = json.loads((folder / job_folders.RECORD_FILE).read_text(encoding="utf-8"))
        job_id = str(record["job_id"])
        base: dict[str, Any] = {
            "name": name,
            "run_dir": record.get("run_dir"),
            "attempt": int(record["attempt"]),
            "log_path": str(folder / LOG_FILE),
            "job_id": job_id,
            "backend": "slurm",
        }
        cancelled = (folder / job_folders.CANCEL_FILE).is_file()
        view = self._slurm_view(name, job_id)
        recorded = _read_exit_code(folder)
        if view is None:
            if recorded is None:
                state: JobState = "cancelled" if cancelled else "failed"
                return JobStatus(
                    state=state,
                    reason=f"SLURM no longer knows job {job_id} and it left no exit record in {folder}",
                    **base,
                )
            view = {"state": "COMPLETED" if recorded == 0 else "FAILED", "reason": "exit record", "exit": ""}
        slurm_state = view["state"].split()[0] if view["state"] else "UNKNOWN"
        state = map_state(slurm_state, cancelled)
        if state == "running":
            return JobStatus(state="running", reason=f"SLURM job {job_id} is {slurm_state} ({view['reason']})", **base)
        code = recorded if recorded is not None else _exit_code(view["exit"])
        if state == "succeeded":
            return JobStatus(state="succeeded", reason=f"SLURM job {job_id} COMPLETED", exit_code=code or 0, **base)
        if state == "cancelled":
            return JobStatus(
                state="cancelled", reason=f"cancelled: SLURM job {job_id} ended {slurm_state}", exit_code=code, **base
            )
        why = _WHY.get(slurm_state, "")
        reason = f"SLURM job {job_id} ended {slurm_state} (exit code {code}, Reason={view['reason'] or 'None'})"
        if why:
            reason += f": {why}"
        tail = read_log_tail(folder / LOG_FILE, REASON_TAIL_LINES).strip()
        if tail:
            reason += "; last log lines:\n" + tail
        return JobStatus(state="failed", reason=reason, exit_code=code, **base)


def _read_exit_code(folder: Path) -> int | None:
    try:
        text = (folder / EXIT_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return int(text) if text.lstrip("-").isdigit() else None


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, 0600 from the first byte."""
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, job_folders.FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temp, job_folders.FILE_MODE)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
