"""A :class:`~storage.validate.runner.ProbeRunner` made of plain local subprocesses, one per "node".

For tests and benchmarks that have no Scheduler at hand. ``wrap(node, argv) -> argv`` may rewrite
each node's command, e.g. to run it in its own mount namespace where a different directory is bind-
mounted at the shared path (``unshare -m sh -c 'mount --bind A /shared && exec "$@"' sh ...``), which
plays a path that is NOT shared between nodes. Processes run in their own session and are killed by
PID when they outlive the timeout.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence

from storage.validate.runner import RANK_PLACEHOLDER, NodeOutcome

__all__ = ["LocalProcessRunner"]

logger = logging.getLogger(__name__)

Wrap = Callable[[int, list[str]], list[str]]


class LocalProcessRunner:
    """Runs the probe command as ``nodes`` concurrent local processes."""

    def __init__(self, wrap: Wrap | None = None, cwd: str | None = None) -> None:
        self.wrap = wrap
        self.cwd = cwd

    def run_on_nodes(
        self, command: Sequence[str], nodes: int, env: Mapping[str, str], timeout_s: float
    ) -> list[NodeOutcome]:
        full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        processes = []
        for node in range(nodes):
            argv = [part.replace(RANK_PLACEHOLDER, str(node)) for part in command]
            if self.wrap is not None:
                argv = self.wrap(node, argv)
            processes.append(
                subprocess.Popen(
                    argv,
                    env=full_env,
                    cwd=self.cwd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout_s
        outcomes = []
        for node, process in enumerate(processes):
            try:
                out, _ = process.communicate(timeout=max(0.0, deadline - time.monotonic()))
                outcomes.append(NodeOutcome(node, process.returncode, out.decode(errors="replace")))
            except subprocess.TimeoutExpired:
                logger.warning(
                    "probe node %d (pid %d) still runs after %.0fs; killing it", node, process.pid, timeout_s
                )
                os.killpg(process.pid, signal.SIGKILL)
                out, _ = process.communicate()
                outcomes.append(NodeOutcome(node, None, out.decode(errors="replace")))
        return outcomes
