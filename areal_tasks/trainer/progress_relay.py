"""Show a worker's progress bar on the controller's terminal.

Train workers write their output (tqdm bars included) to their log files under ``<run_dir>/logs``;
the controller, which waits on them, would otherwise show nothing for minutes. A
:class:`ProgressRelay` follows rank 0's log and re-draws the newest progress-bar line on the
controller's stderr (only bar lines: the log keeps everything else). :func:`wait_with_progress`
polls a worker group until it exits, relaying, and raises on a failed worker.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from areal_tasks.api.scheduler import Scheduler, WorkerStatus

#: a tqdm bar: "desc:  42%|####      | 21/50 [...]".
_BAR = re.compile(r"\S*:?\s*\d+%\|.*\|\s*\d+/\d+.*")


class ProgressRelay:
    """Re-draws the newest tqdm line found in ``log_path`` on ``stream``."""

    def __init__(self, log_path: str | Path, stream: TextIO | None = None) -> None:
        self.path = Path(log_path)
        self.stream = stream or sys.stderr
        self._offset = 0
        self._shown = ""

    def poll(self) -> str | None:
        """Read what the log gained since the last poll; show and return its newest bar line."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except FileNotFoundError:
            return None
        self._offset += len(chunk)
        segments = re.split(r"[\r\n]", chunk.decode("utf-8", errors="replace"))
        bars = [seg.strip() for seg in segments if _BAR.search(seg)]
        if not bars or bars[-1] == self._shown:
            return None
        self._shown = bars[-1]
        self.stream.write("\r" + self._shown[:150].ljust(150))
        self.stream.flush()
        return self._shown

    def close(self) -> None:
        """End the relayed line (call once the worker is done)."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()


def wait_with_progress(
    scheduler: Scheduler,
    group: str,
    *,
    poll_s: float = 1.0,
    on_poll: Callable[[], None] | None = None,
    show: bool = True,
) -> None:
    """Until every worker of ``group`` succeeded: relay rank 0's bar, call ``on_poll``, raise on a failure."""
    relay = ProgressRelay(scheduler.status(group)[0].log_path) if show else None
    try:
        while True:
            scheduler.check(group)  # raises WorkerFailedError with the log tail
            if relay is not None:
                relay.poll()
            if all(w.status is WorkerStatus.SUCCEEDED for w in scheduler.status(group)):
                return
            if on_poll is not None:
                on_poll()
            time.sleep(poll_s)
    finally:
        if relay is not None:
            relay.poll()
            relay.close()
