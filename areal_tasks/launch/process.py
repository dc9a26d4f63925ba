"""One worker process: spawned in its own session, logged to a file, stopped as a whole group.

Each worker leads a new session (``start_new_session=True``), so its process group id is its pid
and every child it forks stays in that group unless it calls ``setsid`` itself. Stopping sends
SIGTERM to the whole group, waits for the group (not just the leader) to empty, then SIGKILLs
what is left: grandchildren that ignore SIGTERM die too.

Liveness is read from ``/proc`` on Linux so that zombies count as dead: an orphaned grandchild that
was killed stays a zombie until its new parent reaps it, and a container's PID 1 may never do so.
Elsewhere ``killpg(pgid, 0)`` is used, which counts zombies as alive.

A process that leaves the group (``setsid``, a daemon's double fork) escapes ``killpg``;
:func:`kill_tree` also finds it: it freezes (SIGSTOP) the root, its group, its descendants by
parent pid and every process whose environment carries the worker's marker (``AREAL_PROCESS_MARKERS``,
inherited by everything a worker starts unless the environment is replaced), until no new one
appears, then SIGKILLs them all at once, so none can fork or be re-parented out of reach in between.
:class:`WorkerProcess` gives every worker a marker and :func:`stop_processes` ends with
:func:`kill_tree`; the reward pool uses it on a timed-out reward.

The logged command line goes through :func:`storage.redact.redact_argv`, the one redaction: values
of secret flags (``--api-key KEY``, ``--aws-secret-access-key=...``), of dotted secret overrides
(``storage.options.secret=...``) and URL passwords are masked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from areal_tasks.errors import SchedulerError
from storage.redact import redact_argv

logger = logging.getLogger(__name__)

__all__ = [
    "MARKER_ENV",
    "WorkerProcess",
    "kill_tree",
    "new_marker",
    "pid_alive",
    "read_log_tail",
    "stop_processes",
    "tree_pids",
    "with_marker",
]

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


#: environment variable listing (space-separated) the markers of every process tree a process belongs to.
MARKER_ENV = "AREAL_PROCESS_MARKERS"
_KILL_POLL_S = 0.02


def new_marker(kind: str) -> str:
    """A fresh marker for one process tree (``kind`` makes it readable in ``/proc/<pid>/environ``)."""
    return f"{kind}-{uuid.uuid4().hex[:16]}"


def with_marker(env: Mapping[str, str], marker: str) -> dict[str, str]:
    """A copy of ``env`` whose :data:`MARKER_ENV` also carries ``marker`` (inherited markers stay)."""
    markers = env.get(MARKER_ENV, "").split()
    return {**env, MARKER_ENV: " ".join([*markers, marker])}


def _carries(pid: int, marker: str) -> bool:
    """Whether ``pid``'s environment lists ``marker`` in :data:`MARKER_ENV` (False if unreadable)."""
    try:
        environ = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's process
        return False
    prefix = MARKER_ENV.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return marker.encode() in entry[len(prefix) :].split()
    return False


def _process_table() -> dict[int, tuple[str, int, int]]:
    """``pid -> (state, ppid, pgrp)`` of every process in /proc."""
    table: dict[int, tuple[str, int, int]] = {}
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        try:
            text = (_PROC / entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        table[int(entry)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def _ancestors(table: dict[int, tuple[str, int, int]]) -> set[int]:
    """This process and its ancestors: never part of a tree this process kills."""
    out, pid = set(), os.getpid()
    while pid > 0 and pid not in out:
        out.add(pid)
        pid = table[pid][1] if pid in table else 0
    return out


def tree_pids(pid: int | None, marker: str | None = None) -> set[int]:
    """Live (non-zombie) pids of ``pid``, its process group, its descendants and ``marker``'s carriers.

    The group counts when ``pid`` leads one (a session leader's group id is its pid; the group may
    outlive its leader). Never this process or its ancestors. Linux only (empty without /proc).
    """
    if not _PROC.is_dir():
        return set()
    table = _process_table()
    live = {p for p, (state, _, _) in table.items() if state not in ("Z", "X")}
    found: set[int] = set()
    if pid is not None:
        found |= {p for p in table if p == pid or table[p][2] == pid}
        children: dict[int, list[int]] = {}
        for p, (_, ppid, _) in table.items():
            children.setdefault(ppid, []).append(p)
        stack = list(found)
        while stack:  # descendants by parent pid, zombies included (their children are still ours)
            for child in children.get(stack.pop(), ()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
    if marker:
        found |= {p for p in live if _carries(p, marker)}
    return (found & live) - _ancestors(table)


def _signal_all(pids: set[int], sig: signal.Signals) -> None:
    for target in pids:
        # gone meanwhile; or a recycled pid now owned by someone else
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, sig)


def kill_tree(pid: int | None, marker: str | None = None, *, grace_s: float = 0.0, wait_s: float = 10.0) -> list[int]:
    """Kill ``pid``'s whole tree (see :func:`tree_pids`), escaped members included; return survivors.

    With ``grace_s > 0`` the tree first gets SIGTERM and that long to exit. Then, until nothing is
    left or ``wait_s`` passes: SIGSTOP every member and look again until no new one appears (a frozen
    process cannot fork, and its children cannot be re-parented away while it lives), then SIGKILL
    them all. Does not reap: the caller waits for its own children. Pass ``pid`` only while it cannot
    have been recycled (the caller's child not yet reaped), else ``None`` and a marker. The returned
    pids survived SIGKILL for ``wait_s`` (uninterruptible sleep).
    """
    members = tree_pids(pid, marker)
    if grace_s > 0 and members:
        _signal_all(members, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while members and time.monotonic() < deadline:
            time.sleep(_KILL_POLL_S)
            members = tree_pids(pid, marker)
    deadline = time.monotonic() + wait_s
    while members:
        frozen: set[int] = set()
        while members - frozen:
            _signal_all(members - frozen, signal.SIGSTOP)
            frozen |= members
            members = tree_pids(pid, marker)
        logger.debug("kill_tree(%s, %s): SIGKILL to %s", pid, marker, sorted(members))
        _signal_all(members, signal.SIGKILL)
        time.sleep(_KILL_POLL_S)
        members = tree_pids(pid, marker)
        if time.monotonic() >= deadline:
            break
    return sorted(members)


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

    def __init__(self, name: str, popen: subprocess.Popen[bytes], log_path: Path, marker: str | None = None) -> None:
        self.name = name
        self.popen = popen
        self.log_path = log_path
        #: carried in the environment of everything this worker starts (see :func:`kill_tree`).
        self.marker = marker
        self._group_gone = False

    @classmethod
    def spawn(cls, name: str, argv: list[str], env: dict[str, str], cwd: str | None, log_path: Path) -> WorkerProcess:
        """Start ``argv`` with stdout+stderr appended to ``log_path``; SchedulerError if it cannot start."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        marker = new_marker("worker")
        with open(log_path, "ab") as log:
            try:
                popen = subprocess.Popen(
                    argv,
                    env=with_marker(env, marker),
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
        return cls(name, popen, log_path, marker)

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

    Processes that left a worker's group but carry its marker get the SIGTERM too and, once the
    groups are empty or killed, :func:`kill_tree`'s SIGKILL. Returns once every group is empty and
    every leader has been reaped; raises SchedulerError if a process survives SIGKILL for
    ``kill_wait_s`` (e.g. stuck in uninterruptible I/O).
    """
    live = _live_groups()
    targets = [p for p in procs if p.group_alive(live)]
    for proc in targets:
        logger.info("stopping %s (process group %s): SIGTERM", proc.name, proc.pid)
        proc.signal_group(signal.SIGTERM)
    groups = {p.pid for p in procs}
    for proc in procs:
        _signal_all(_escaped(proc, groups), signal.SIGTERM)
    stubborn = _wait_groups(targets, time.monotonic() + grace_s, poll_s)
    for proc in stubborn:
        logger.warning("%s did not stop within %.1fs of SIGTERM: SIGKILL to its process group", proc.name, grace_s)
        proc.signal_group(signal.SIGKILL)
    survivors = _wait_groups(stubborn, time.monotonic() + kill_wait_s, poll_s)
    left_over: dict[str, list[int]] = {}
    for proc in procs:
        if _escaped(proc, groups):
            logger.warning("%s: killing the processes it started outside its process group (setsid)", proc.name)
            left = kill_tree(None, proc.marker, wait_s=kill_wait_s)
            if left:
                left_over[proc.name] = left
    for proc in procs:
        if proc.poll() is None and proc not in survivors:
            proc.popen.wait(timeout=kill_wait_s)
    if survivors or left_over:
        names = ", ".join(
            [f"{p.name} (pgid {p.pid})" for p in survivors] + [f"{n} (pids {v})" for n, v in left_over.items()]
        )
        raise SchedulerError(
            f"processes of {names} survived SIGKILL for {kill_wait_s:.0f}s (uninterruptible sleep?); "
            "inspect them with `ps -o pid,stat,wchan -p <pid>` and free the resource they wait on"
        )


def _escaped(proc: WorkerProcess, groups: set[int]) -> set[int]:
    """Live processes carrying ``proc``'s marker outside every group in ``groups``."""
    if not proc.marker:
        return set()
    out = set()
    for pid in tree_pids(None, proc.marker):
        stat = _proc_stat(pid)
        if stat is not None and stat[1] not in groups:
            out.add(pid)
    return out
