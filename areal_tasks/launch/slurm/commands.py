"""Every SLURM command goes through :func:`run_slurm`; plus the parsers of their output.

``SLURM_CONF`` is always set in the command's environment: a SLURM client without a
``slurm.conf`` falls back to "configless" mode and asks the resolver for DNS SRV records, traffic
that must not leave a test machine and that is a confusing error on a real one. The file comes from
the caller (the ``cluster.slurm`` section or the Airflow connection), else ``$SLURM_CONF``, else
``/etc/slurm/slurm.conf``, and it must exist. A non-zero exit becomes a :class:`SchedulerError`
carrying the command and SLURM's own message.

The parsers read the two output forms used here: ``squeue -o "%i|%T|%r"`` (one ``|``-separated row
per line) and ``scontrol show ... -o`` (``Key=Value`` pairs on one line; a few values, like a
node's ``OS=Linux 6.1 #1 SMP``, hold spaces).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from areal_tasks.errors import SchedulerError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SLURM_CONF",
    "parse_key_values",
    "parse_rows",
    "resolve_slurm_conf",
    "run_slurm",
    "slurm_env",
]

#: where SLURM's clients look for their configuration when nothing else says.
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
#: ``Key=`` at the start of the line or after whitespace starts a new pair in ``scontrol -o`` output.
_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.]*)=")


def resolve_slurm_conf(explicit: str | os.PathLike[str] | None = None) -> str:
    """``explicit``, else ``$SLURM_CONF``, else ``/etc/slurm/slurm.conf``; SchedulerError if it does not exist."""
    source = "cluster.slurm.slurm_conf"
    path = explicit
    if not path:
        path, source = os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF, "$SLURM_CONF"
        if not os.environ.get("SLURM_CONF"):
            source = "the default"
    resolved = str(Path(path).expanduser())
    if not Path(resolved).is_file():
        raise SchedulerError(
            f"slurm.conf not found at {resolved} ({source}); set cluster.slurm.slurm_conf (or the areal_slurm "
            "connection's extra 'slurm_conf', or $SLURM_CONF) to the cluster's slurm.conf: without one the SLURM "
            "commands would look the controller up through DNS"
        )
    return resolved


def slurm_env(slurm_conf: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus ``env``, with ``SLURM_CONF`` set to ``slurm_conf``."""
    return {**os.environ, **dict(env or {}), "SLURM_CONF": slurm_conf}


def run_slurm(
    argv: Sequence[str],
    timeout: float = 30.0,
    *,
    slurm_conf: str,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run one SLURM command (``sbatch``, ``squeue``, ``scontrol``...) and capture its output.

    ``env`` is added to this process's environment (secrets travel this way, never in argv).
    With ``check`` a non-zero exit raises SchedulerError with the command and its stderr; a command
    that is missing or runs past ``timeout`` seconds raises in any case.
    """
    shown = shlex.join(argv)
    try:
        done = subprocess.run(
            list(argv),
            check=False,
            env=slurm_env(slurm_conf, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise SchedulerError(
            f"{argv[0]} not found: install the SLURM client tools on this machine (Debian: apt-get install "
            "slurm-client) and make sure they are on PATH"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise SchedulerError(
            f"`{shown}` did not answer within {timeout:.0f}s: is slurmctld up and reachable from this machine "
            f"(SLURM_CONF={slurm_conf})?"
        ) from exc
    logger.debug("%s -> %d", shown, done.returncode)
    if check and done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip() or "no output").replace("\n", "; ")
        raise SchedulerError(f"`{shown}` failed (exit {done.returncode}): {message}")
    return done


def parse_key_values(line: str) -> dict[str, str]:
    """``scontrol show ... -o`` output (one record) as a dict; values may hold spaces and ``=``."""
    matches = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[match.group(1)] = line[match.end() : end].strip()
    return out


def parse_rows(text: str, fields: Sequence[str], sep: str = "|") -> list[dict[str, str]]:
    """Rows of ``squeue -h -o "%i|%T|%r"``-like output as dicts keyed by ``fields`` (blank lines skipped).

    The last field takes the rest of the line (a reason may hold the separator).
    """
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(sep, len(fields) - 1)
        parts += [""] * (len(fields) - len(parts))
        rows.append({name: value.strip() for name, value in zip(fields, parts)})
    return rows
