"""Detached, named jobs for the local scheduler: submit, look up, cancel, read the log.

A job is one command (normally ``python -m areal_tasks.cli train ...``) that must outlive the
process that submitted it: an Airflow task submits it, defers, and a later task try (possibly in
another worker process) looks it up by name again. :class:`LocalJobs` keeps one folder per name
under its root::

    <root>/<name>/attempt_<k>/job.json     argv, run dir, pid and the pid's start time
                              job.log      stdout and stderr of the job
                              exit_code    written by the wrapper when the command ends
                              cancelled    written by cancel() before it signals the job

Every submission of a name is a new attempt (a resubmission after a failure keeps the old log).
The folders are 0700 and the files 0600: a job's log and record are its owner's. The record holds
the command line as :func:`storage.redact.redact_argv` shows it and the *names* of the variables
added to the job's environment, never their values (secrets reach a job through its environment).

How the job is started: ``python -m areal_tasks.launch.jobs --exit-file F -- ARGV...`` in a new
session (``start_new_session``), so the wrapper leads a new process group that holds the job and
every server or worker the job starts (they stay in that group unless they call ``setsid``). The
wrapper runs ARGV, waits, and writes ARGV's exit code to ``exit_code`` atomically (128+N for death
by signal N). It catches SIGTERM/SIGINT/SIGHUP without dying (the handlers reset on exec, so the
command itself gets the default behaviour), which lets it record the command's exit code after a
graceful cancel.

How the state is read (``status``): an ``exit_code`` file decides (0 = succeeded; else cancelled if
cancel() marked it, else failed). Without one, the job runs while the wrapper's pid is alive *and*
has the start time recorded at submission (so a pid reused by an unrelated process is not taken for
the job); a wrapper that is gone without an exit code was killed (SIGKILL, OOM killer, reboot), and
the job counts as failed (or cancelled, when cancel() did it).

``cancel`` marks the attempt, SIGTERMs the whole process group, waits ``grace_s`` for the group to
empty (zombies count as gone), then SIGKILLs what is left. The job's environment carries a marker
of its attempt (:func:`~areal_tasks.launch.process.with_marker`), inherited by every process it
starts, so processes that left the group (the scheduler's workers are sessions of their own; a
daemon may ``setsid``) get the same SIGTERM and are then killed by
:func:`~areal_tasks.launch.process.kill_tree`, also when the controller itself was SIGKILLed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.jobs import JobStatus
from areal_tasks.errors import SchedulerError
from areal_tasks.launch import job_folders
from areal_tasks.launch.process import kill_tree, read_log_tail, tree_pids, with_marker
from storage.redact import redact_argv

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["JOBS_ROOT_ENV", "LocalJobs", "jobs_root_for", "validate_job_name"]

LOG_FILE = "job.log"
EXIT_FILE = "exit_code"
#: longest job name accepted (it is a directory name).
MAX_NAME_LENGTH = 200
#: seconds the job's processes outside its group get between SIGTERM and SIGKILL (after the group is gone).
ESCAPED_GRACE_S = 2.0
#: seconds cancel() waits for the group to die after SIGKILL before it gives up.
KILL_WAIT_S = 10.0
#: log lines quoted in the reason of a failed job.
REASON_TAIL_LINES = 5
#: where job records go when set (also read by the Airflow operators); else next to the run directory.
JOBS_ROOT_ENV = "AREAL_JOBS_ROOT"
#: the folder of job records next to the run directory: ``<run_dir>/../areal_jobs``.
JOBS_DIR_NAME = "areal_jobs"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PROC = Path("/proc")
# Wrapper processes this process started: polled so that they do not stay zombies here.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def validate_job_name(name: str) -> str:
    """``name`` if it is usable as a job name (a directory name), else SchedulerError saying why."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_LENGTH:
        raise SchedulerError(
            f"job name {name!r} is not usable: use 1-{MAX_NAME_LENGTH} characters from [A-Za-z0-9._-], "
            "starting with a letter or digit"
        )
    return name


def jobs_root_for(cfg: JobConfig) -> Path:
    """Where the job records of ``cfg`` go: ``$AREAL_JOBS_ROOT``, else ``areal_jobs`` next to the
    run directory (``<run_dir>/../areal_jobs``), so every trial of an experiment folder shares one."""
    if os.environ.get(JOBS_ROOT_ENV):
        return Path(os.environ[JOBS_ROOT_ENV]).expanduser().absolute()
    run_dir = Path(cfg.experiment.run_dir or ".").expanduser().absolute()
    return run_dir.parent / JOBS_DIR_NAME


class LocalJobs:
    """Named detached jobs on this machine, recorded under ``root`` (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()

    @classmethod
    def from_config(cls, cfg: JobConfig) -> LocalJobs:
        """The job backend of a job: records under :func:`jobs_root_for` (``$AREAL_JOBS_ROOT`` or next
        to the run directory)."""
        return cls(jobs_root_for(cfg))

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
        """Start ``argv`` as job ``name`` and return its (running) status.

        ``env`` is added to this process's environment; ``run_dir`` is recorded (and created) for
        whoever looks the job up later; ``cwd`` is the working directory (default: this process's).
        Refuses (SchedulerError) a name whose latest attempt is still running. Leftover processes of
        an earlier attempt whose wrapper was killed are stopped first.
        """
        validate_job_name(name)
        if not argv:
            raise SchedulerError(f"job {name}: argv is empty; give the command to run")
        with job_folders.locked_job_dir(self._job_dir(name)):
            current = self._latest_attempt(name)
            if current is not None:
                status = self._status_of(name, current)
                if status.state == "running":
                    raise SchedulerError(
                        f"job {name} is already running (pid {status.pid}, attempt {status.attempt}); "
                        "look it up and wait for it, or cancel it before submitting again"
                    )
                self._stop_leftovers(name, current)
            attempt = 1 if current is None else job_folders.attempt_number(current) + 1
            folder = self._job_dir(name) / f"{job_folders.ATTEMPT_PREFIX}{attempt}"
            folder.mkdir(mode=job_folders.DIR_MODE)
            os.chmod(folder, job_folders.DIR_MODE)  # mkdir's mode is filtered by the umask
            if run_dir is not None:
                Path(run_dir).mkdir(parents=True, exist_ok=True)
            log_path = folder / LOG_FILE
            wrapper = [sys.executable, "-m", "areal_tasks.launch.jobs", "--exit-file", str(folder / EXIT_FILE), "--"]
            full_env = with_marker({**os.environ, **dict(env or {}), "PYTHONUNBUFFERED": "1"}, _marker(folder))
            with _open_private(log_path) as log:
                popen = subprocess.Popen(
                    wrapper + list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=full_env,
                    cwd=None if cwd is None else str(cwd),
                    start_new_session=True,
                    close_fds=True,
                )
            _CHILDREN[popen.pid] = popen
            stat = _stat(popen.pid)
            shown = redact_argv(list(argv))  # the record and the log are for people: no secrets in them
            record = {
                "name": name,
                "attempt": attempt,
                "argv": shown,
                "env_keys": sorted((env or {}).keys()),
                "run_dir": None if run_dir is None else str(run_dir),
                "cwd": str(cwd) if cwd is not None else os.getcwd(),
                "pid": popen.pid,
                "start_ticks": None if stat is None else stat[2],
                "submitted_at": time.time(),
            }
            _write_json_atomic(folder / job_folders.RECORD_FILE, record)
        logger.info("submitted job %s (attempt %d, pid %d): %s", name, attempt, popen.pid, " ".join(shown))
        return self._status_of(name, folder)

    def status(self, name: str) -> JobStatus:
        """The state of the latest attempt of ``name`` (``missing`` when it was never submitted)."""
        validate_job_name(name)
        folder = self._latest_attempt(name)
        if folder is None:
            return JobStatus(name, "missing", f"no job named {name} under {self.root}")
        return self._status_of(name, folder)

    def cancel(self, name: str, grace_s: float = 30.0) -> JobStatus:
        """Stop job ``name``: SIGTERM its process group, SIGKILL after ``grace_s``; return its status.

        A job that is not running is left as it is (its status is returned). Raises SchedulerError
        when processes survive SIGKILL (uninterruptible I/O).
        """
        validate_job_name(name)
        with job_folders.locked_job_dir(self._job_dir(name)):
            folder = self._latest_attempt(name)
            if folder is None:
                return JobStatus(name, "missing", f"no job named {name} under {self.root}")
            status = self._status_of(name, folder)
            if status.state != "running":
                logger.info("job %s is %s; nothing to cancel", name, status.state)
                return status
            _write_private(folder / job_folders.CANCEL_FILE, f"{time.time()}\n")
            assert status.pid is not None
            _stop_group(name, status.pid, grace_s, _marker(folder))
            self._reap(status.pid)
        return self._status_of(name, folder)

    def log_tail(self, name: str, n: int = 40) -> str:
        """The last ``n`` lines of the latest attempt's log ('' when there is none)."""
        validate_job_name(name)
        folder = self._latest_attempt(name)
        return "" if folder is None else read_log_tail(folder / LOG_FILE, n)

    # ------------------------------------------------------------------ internals

    def _job_dir(self, name: str) -> Path:
        return self.root / name

    def _latest_attempt(self, name: str) -> Path | None:
        folder = self._job_dir(name)
        if not folder.is_dir():
            return None
        attempts = [
            p
            for p in folder.iterdir()
            if job_folders.ATTEMPT_RE.match(p.name) and (p / job_folders.RECORD_FILE).is_file()
        ]
        return max(attempts, key=job_folders.attempt_number) if attempts else None

    def _status_of(self, name: str, folder: Path) -> JobStatus:
        record = json.loads((folder / job_folders.RECORD_FILE).read_text(encoding="utf-8"))
        pid = int(record["pid"])
        self._reap(pid)
        base = {
            "name": name,
            "run_dir": record.get("run_dir"),
            "pid": pid,
            "attempt": int(record["attempt"]),
            "log_path": str(folder / LOG_FILE),
        }
        cancelled = (folder / job_folders.CANCEL_FILE).is_file()
        code = _read_exit_code(folder)
        if code is None:
            if _same_process(pid, record.get("start_ticks")):
                return JobStatus(state="running", reason=f"running as process group {pid}", **base)
            code = _read_exit_code(folder)  # the wrapper may have written it and exited just now
        if code is None:
            if cancelled:
                return JobStatus(
                    state="cancelled", reason="cancelled; the job was killed before it recorded an exit code", **base
                )
            return JobStatus(
                state="failed",
                reason=f"the job's wrapper (pid {pid}) is gone without recording an exit code: it was killed "
                "(SIGKILL, the OOM killer or a reboot?); see the log " + str(folder / LOG_FILE),
                **base,
            )
        if code == 0:
            return JobStatus(state="succeeded", reason="exited with code 0", exit_code=0, **base)
        if cancelled:
            return JobStatus(state="cancelled", reason=f"cancelled (exit code {code})", exit_code=code, **base)
        tail = read_log_tail(folder / LOG_FILE, REASON_TAIL_LINES).strip()
        reason = f"exited with code {code}{_describe_code(code)}"
        if tail:
            reason += "; last log lines:\n" + tail
        return JobStatus(state="failed", reason=reason, exit_code=code, **base)

    def _stop_leftovers(self, name: str, folder: Path) -> None:
        """Kill what is left of an ended attempt's process group (servers orphaned by a killed wrapper)."""
        record = json.loads((folder / job_folders.RECORD_FILE).read_text(encoding="utf-8"))
        pgid = int(record["pid"])
        stat = _stat(pgid)
        if stat is not None and stat[0] not in ("Z", "X") and stat[2] != record.get("start_ticks"):
            return  # the pid now belongs to another process: its group is not ours
        if _group_members(pgid) or tree_pids(None, _marker(folder)):
            logger.warning(
                "job %s: processes of the ended attempt %s are still alive; stopping them", name, folder.name
            )
            _stop_group(name, pgid, 10.0, _marker(folder))

    @staticmethod
    def _reap(pid: int) -> None:
        popen = _CHILDREN.get(pid)
        if popen is not None and popen.poll() is not None:
            del _CHILDREN[pid]


# ---------------------------------------------------------------------- process helpers


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, pgrp, start time in clock ticks)`` of ``pid`` from /proc, or None if it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces or ')'
    return fields[0], int(fields[2]), int(fields[19])


def _same_process(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` is alive (not a zombie) and is the process that started at ``start_ticks``."""
    stat = _stat(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return start_ticks is None or stat[2] == start_ticks


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids of process group ``pgid``."""
    members = []
    for entry in os.listdir(_PROC):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group emptied between the look and the signal
        os.killpg(pgid, sig)


def _wait_group_empty(pgid: int, deadline: float) -> list[int]:
    """Poll until group ``pgid`` has no live member or ``deadline``; return the members left."""
    while True:
        members = _group_members(pgid)
        if not members or time.monotonic() >= deadline:
            return members
        LocalJobs._reap(pgid)
        time.sleep(0.05)


def _marker(folder: Path) -> str:
    """The marker in the environment of every process of the attempt in ``folder`` (stable per folder)."""
    return "job-" + hashlib.sha256(str(folder).encode()).hexdigest()[:16]


def _stop_group(name: str, pgid: int, grace_s: float, marker: str) -> None:
    """SIGTERM group ``pgid``, wait ``grace_s``, SIGKILL what is left; then the same (with a short
    grace) for ``marker``'s processes outside the group (the job's own shutdown normally stops them
    first). SchedulerError if something survives."""
    logger.info("job %s: SIGTERM to process group %d", name, pgid)
    _signal_group(pgid, signal.SIGTERM)
    left = _wait_group_empty(pgid, time.monotonic() + grace_s)
    if left:
        logger.warning("job %s: %d process(es) still alive %.1fs after SIGTERM: SIGKILL", name, len(left), grace_s)
        _signal_group(pgid, signal.SIGKILL)
        left = _wait_group_empty(pgid, time.monotonic() + KILL_WAIT_S)
    if tree_pids(None, marker):
        logger.warning("job %s: processes it started outside its process group are still alive: stopping them", name)
        left += kill_tree(None, marker, grace_s=min(grace_s, ESCAPED_GRACE_S), wait_s=KILL_WAIT_S)
    if left:
        raise SchedulerError(
            f"job {name}: processes {left} of group {pgid} survived SIGKILL for {KILL_WAIT_S:.0f}s "
            "(uninterruptible I/O?); inspect them with `ps -o pid,stat,wchan -g "
            f"{pgid}` and free what they wait on"
        )


def _read_exit_code(folder: Path) -> int | None:
    try:
        text = (folder / EXIT_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return int(text)


def _describe_code(code: int) -> str:
    if code > 128:
        try:
            return f" (killed by {signal.Signals(code - 128).name})"
        except ValueError:
            return ""
    return ""


def _open_private(path: Path) -> Any:
    """``path`` opened for appending (binary), created 0600."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, job_folders.FILE_MODE), "ab")


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably, readable by its owner only (0600).

    The temporary file is created 0600 (``mkstemp``) before any byte is written, so the content is
    never readable by others, not even for a moment.
    """
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    _write_private(path, json.dumps(payload, indent=1))


# ---------------------------------------------------------------------- the wrapper


def _wrap(exit_file: Path, argv: list[str]) -> int:
    """Run ``argv``, write its exit code to ``exit_file`` (atomically), return it."""

    def note(signum: int, frame: object) -> None:  # a handler (not SIG_IGN): reset to default on exec
        sys.stderr.write(f"[areal job wrapper] received {signal.Signals(signum).name}; waiting for the job to end\n")

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, note)
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        sys.stderr.write(f"[areal job wrapper] cannot start {argv[0]!r}: {exc}\n")
        code = 127
    if code < 0:
        code = 128 - code
    _write_private(exit_file, f"{code}\n")
    return code


def main(args: list[str] | None = None) -> int:
    """``python -m areal_tasks.launch.jobs --exit-file F -- ARGV...`` (what :meth:`LocalJobs.submit` runs)."""
    parser = argparse.ArgumentParser(prog="python -m areal_tasks.launch.jobs", description=__doc__.splitlines()[0])
    parser.add_argument("--exit-file", required=True, type=Path)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    argv = ns.argv[1:] if ns.argv[:1] == ["--"] else ns.argv
    if not argv:
        parser.error("give the command after --")
    return _wrap(ns.exit_file, argv)


if __name__ == "__main__":
    sys.exit(main())
