"""The reaper a Ray supervisor leaves next to every worker it starts: no orphans when the actor dies.

When a Ray actor dies (``ray.kill``, its driver gone, its node's raylet killing it), Ray kills only
the actor's *direct* child processes; a worker's own children survive as orphans. The supervisor
therefore starts ``python -m areal_tasks.launch.ray.reaper --watch-pid <actor pid> --marker M``
and this module forks once more (the double fork): the reaper is then nobody's direct child of the
actor, so Ray does not kill it. It checks the actor's pid every ``--interval-s``; once that pid is
gone it kills every process carrying the worker's marker (:func:`~areal_tasks.launch.process.kill_tree`,
which also catches processes that called ``setsid``) and exits. It exits on its own as soon as no
process carries the marker any more (the worker ended or was stopped by the supervisor).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from collections.abc import Mapping

from areal_tasks.launch.process import MARKER_ENV, kill_tree, pid_alive, tree_pids

logger = logging.getLogger(__name__)

__all__ = ["main", "spawn_reaper"]

#: seconds between two looks at the actor's pid.
INTERVAL_S = 0.5


def spawn_reaper(actor_pid: int, marker: str, env: Mapping[str, str], log_path: str) -> None:
    """Start the reaper for ``marker``'s tree (it detaches itself; returns once it has).

    ``env`` is the reaper's environment: it must not carry ``marker`` (the reaper is not part of
    the tree it kills). Its own messages are appended to ``log_path`` (the worker's log).
    """
    clean = {k: v for k, v in env.items() if k != MARKER_ENV}
    argv = [sys.executable, "-m", "areal_tasks.launch.ray.reaper", "--watch-pid", str(actor_pid), "--marker", marker]
    with open(log_path, "ab") as log:
        first = subprocess.Popen(
            [*argv, "--detach"],
            env=clean,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    # the first process forks the real reaper and exits at once: wait for it, so it is no zombie
    first.wait(timeout=30)


def watch(actor_pid: int, marker: str, interval_s: float = INTERVAL_S) -> int:
    """Poll until the actor is gone (then kill the marker's tree) or the tree is empty; 0 = clean."""
    while True:
        if not tree_pids(None, marker):
            return 0
        if not pid_alive(actor_pid):
            left = kill_tree(None, marker)
            print(
                f"areal reaper: supervisor actor (pid {actor_pid}) is gone; killed the worker's processes"
                + (f", survivors {left}" if left else ""),
                file=sys.stderr,
                flush=True,
            )
            return 1 if left else 0
        time.sleep(interval_s)


def main(args: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watch-pid", type=int, required=True, help="the supervisor actor's pid")
    parser.add_argument("--marker", required=True, help="the worker tree's marker (AREAL_PROCESS_MARKERS)")
    parser.add_argument("--interval-s", type=float, default=INTERVAL_S)
    parser.add_argument("--detach", action="store_true", help="fork, and let the child do the watching")
    opts = parser.parse_args(args)
    if opts.detach and os.fork() > 0:
        return 0  # the parent exits: the child is re-parented away from the actor
    return watch(opts.watch_pid, opts.marker, opts.interval_s)


if __name__ == "__main__":
    sys.exit(main())
