"""The folders of named detached jobs, shared by the local and the SLURM job backends.

:class:`~areal_tasks.launch.jobs.LocalJobs` and :class:`~areal_tasks.launch.slurm.jobs.SlurmJobs`
keep one folder per job name under their root and one ``attempt_<k>`` folder per submission in it,
each with the job's record (``job.json``) and, once cancel() has marked it, ``cancelled``. Folders
are 0700 and files 0600: a job's log and record are its owner's. Submit and cancel of one name are
serialised across processes by an flock on ``<root>/<name>/.lock`` (:func:`locked_job_dir`).
"""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "ATTEMPT_PREFIX",
    "ATTEMPT_RE",
    "CANCEL_FILE",
    "DIR_MODE",
    "FILE_MODE",
    "RECORD_FILE",
    "attempt_number",
    "locked_job_dir",
]

RECORD_FILE = "job.json"
CANCEL_FILE = "cancelled"
ATTEMPT_PREFIX = "attempt_"
#: job folders and the files in them are their owner's only.
DIR_MODE = 0o700
FILE_MODE = 0o600
ATTEMPT_RE = re.compile(rf"^{ATTEMPT_PREFIX}(\d+)$")


def attempt_number(folder: Path) -> int:
    """``k`` of an ``attempt_<k>`` folder."""
    match = ATTEMPT_RE.match(folder.name)
    assert match is not None, folder
    return int(match.group(1))


@contextmanager
def locked_job_dir(folder: Path) -> Iterator[None]:
    """Hold the flock on ``folder/.lock`` (``folder``, a job name's folder, is created 0700 first)."""
    folder.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    os.chmod(folder, DIR_MODE)
    with open(folder / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
