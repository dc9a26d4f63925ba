"""One worker process: spawned in its own session, logged to a file, stopped as a whole group.

Each worker leads a new session (``start_new_session=True``), so its process group id is its pid
and every child it forks stays in that group unless it calls ``setsid`` itself. Stopping sends
SIGTERM to the whole group, waits for the group (not just the leader) to empty, then SIGKILLs
what is left: grandchildren that ignore SIGTERM die too.

Liveness is read from ``/proc`` on Linux so that zombies count as dead: an orphaned grandchild that
was killed stays a zombie until its new parent reaps it, and a container's PID 1 may never do so.
Elsewhere ``killpg(pgid, 0)`` is used, which counts zombies as alive.

The logged command line goes through :func:`storage.redact.redact_argv`, the one redaction: values
of secret flags (``--api-key KEY``, ``--aws-secret-access-key=...``), of dotted secret overrides
(``storage.options.secret=...``) and URL passwords are masked.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from areal_tasks.errors import SchedulerError
from storage.redact import redact_argv

logger = logging.getLogger(__name__)

__all__ = ["WorkerProcess", "pid_alive", "read_log_tail", "stop_processes"]

_PROC = Path("/proc")
_TAIL_BYTES = 64 * 1024


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, pgrp)`` of ``pid`` from /proc, or None if it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (non-zombie) process."""
    if _PROC.is_dir():
        stat = _proc_stat(pid)
        return stat is not None and stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _live_groups() -> set[int] | None:
    """Process group ids that have at least one non-zombie member (None without /proc)."""
    if not _PROC.is_dir():
        return None
    groups: set[int] = set()
    for entry in os.listdir(_PROC):
        if entry.isdigit():
            stat = _proc_stat(int(entry))
            if stat is not None and stat[0] not in ("Z", "X"):
                groups.add(stat[1])
    return groups


def read_log_tail(path: str | os.PathLike[str], lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - _TAIL_BYTES))
            data = handle.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


class WorkerProcess:
    """A spawned worker; the leader of its own process group."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        self._group_gone = False

    @classmethod
    def spawn(cls, name: str, argv: list[str], env: dict[str, str], cwd: str | None, log_path: Path) -> WorkerProcess:
        """Start ``argv`` with stdout+stderr appended to ``log_path``; SchedulerError if it cannot start."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            try:
                popen = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise SchedulerError(
                    f"could not start worker {name}: {argv[0]!r}: {exc}; check that the command exists and "
                    f"is executable, and that cwd={cwd!r} exists"
                ) from exc
        logger.info("started %s (pid %s): %s; log %s", name, popen.pid, " ".join(redact_argv(argv)), log_path)
        return cls(name, popen, log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The leader's exit code, or None while it runs (reaps it once it has exited)."""
        return self.popen.poll()

    def group_alive(self, live_groups: set[int] | None = None) -> bool:
        """Whether any process of this worker's group still runs (pass a :func:`_live_groups` scan)."""
        if self._group_gone:
            return False
        self.poll()
        if live_groups is None:
            live_groups = _live_groups()
        if live_groups is not None:
            alive = self.pid in live_groups
        else:
            try:
                os.killpg(self.pid, 0)
                alive = True
            except ProcessLookupError:
                alive = False
        # Once empty, the group id may be recycled by an unrelated process: never signal it again.
        self._group_gone = not alive
        return alive

    def signal_group(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of the group (no-op if the group is gone)."""
        if self._group_gone:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            self._group_gone = True
            logger.debug("%s: process group %s already gone", self.name, self.pid)

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of this worker's log."""
        return read_log_tail(self.log_path, lines)


def _wait_groups(procs: list[WorkerProcess], deadline: float, poll_s: float) -> list[WorkerProcess]:
    """Poll until every group is empty or ``deadline`` passes; return those still alive."""
    while True:
        live = _live_groups()
        remaining = [p for p in procs if p.group_alive(live)]
        if not remaining or time.monotonic() >= deadline:
            return remaining
        time.sleep(poll_s)


def stop_processes(procs: list[WorkerProcess], grace_s: float, kill_wait_s: float = 10.0, poll_s: float = 0.05) -> None:
    """SIGTERM every group, wait up to ``grace_s`` for all to empty, then SIGKILL what is left.

    Returns once every group is empty and every leader has been reaped; raises SchedulerError if a
    process survives SIGKILL for ``kill_wait_s`` (e.g. stuck in uninterruptible I/O).
    """
    live = _live_groups()
    targets = [p for p in procs if p.group_alive(live)]
    for proc in targets:
        logger.info("stopping %s (process group %s): SIGTERM", proc.name, proc.pid)
        proc.signal_group(signal.SIGTERM)
    stubborn = _wait_groups(targets, time.monotonic() + grace_s, poll_s)
    for proc in stubborn:
        logger.warning("%s did not stop within %.1fs of SIGTERM: SIGKILL to its process group", proc.name, grace_s)
        proc.signal_group(signal.SIGKILL)
    survivors = _wait_groups(stubborn, time.monotonic() + kill_wait_s, poll_s)
    for proc in procs:
        if proc.poll() is None and proc not in survivors:
            proc.popen.wait(timeout=kill_wait_s)
    if survivors:
        names = ", ".join(f"{p.name} (pgid {p.pid})" for p in survivors)
        raise SchedulerError(
            f"processes of {names} survived SIGKILL for {kill_wait_s:.0f}s (uninterruptible sleep?); "
            "inspect them with `ps -o pid,stat,wchan -g <pgid>` and free the resource they wait on"
        )
