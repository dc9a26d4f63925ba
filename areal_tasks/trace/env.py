"""How the ``trace`` config reaches every process of a run: environment variables.

The controller turns ``trace`` into :func:`trace_environment` and hands it to what it starts, the
way it hands the servers' keys (never argv): the train workers' spec, the servers' command
(``inference/launch/commands.py``), and through the train ranks' environment the rollout child
process and the reward workers. Each entry point then calls :func:`configure_from_env` with its
role. Without :data:`TRACE_DIR_ENV` a process has no tracer, and every span is a no-op.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from areal_tasks.trace.tracer import Tracer, current, install, uninstall

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = [
    "TRACE_DIR_ENV",
    "TRACE_EVERY_ENV",
    "TRACE_MAX_EVENTS_ENV",
    "TRACE_ROLE_ENV",
    "configure_from_env",
    "finish_trace",
    "start_trace",
    "trace_dir",
    "trace_environment",
]

#: the directory of the run's part files (``<run_dir>/trace``); set = tracing on.
TRACE_DIR_ENV = "AREAL_TRACE_DIR"
#: ``trace.every_n_steps``.
TRACE_EVERY_ENV = "AREAL_TRACE_EVERY_N_STEPS"
#: ``trace.max_events`` (per process).
TRACE_MAX_EVENTS_ENV = "AREAL_TRACE_MAX_EVENTS"
#: the role a process's entry point uses when this is set (e.g. ``server 1``, set by the fleet).
TRACE_ROLE_ENV = "AREAL_TRACE_ROLE"

#: the part files' directory under a run directory.
PARTS_DIR = "trace"


def trace_dir(run_dir: str | os.PathLike[str]) -> str:
    """``<run_dir>/trace``, absolute."""
    return os.path.abspath(os.path.join(os.fspath(run_dir), PARTS_DIR))


def trace_environment(cfg: JobConfig) -> dict[str, str]:
    """The variables that turn tracing on in a process of ``cfg``'s run (empty when ``trace.enabled``
    is false)."""
    if not cfg.trace.enabled:
        return {}
    return {
        TRACE_DIR_ENV: trace_dir(cfg.experiment.run_dir or "."),
        TRACE_EVERY_ENV: str(cfg.trace.every_n_steps),
        TRACE_MAX_EVENTS_ENV: str(cfg.trace.max_events),
    }


def configure_from_env(role: str, environ: Mapping[str, str] | None = None) -> Tracer | None:
    """Install this process's tracer when the environment turns tracing on; ``$AREAL_TRACE_ROLE``
    overrides ``role``. Returns it (None when tracing is off). A process that has one keeps it."""
    env = os.environ if environ is None else environ
    directory = env.get(TRACE_DIR_ENV)
    if not directory:
        return None
    existing = current()
    if existing is not None and existing.pid == os.getpid():
        return existing
    tracer = Tracer(
        directory,
        env.get(TRACE_ROLE_ENV) or role,
        every_n_steps=int(env.get(TRACE_EVERY_ENV, "1")),
        max_events=int(env.get(TRACE_MAX_EVENTS_ENV, "1000000")),
    )
    return install(tracer)


def start_trace(cfg: JobConfig, role: str) -> bool:
    """The job's own process (the controller): install its tracer when ``trace.enabled``; whether it did."""
    if not cfg.trace.enabled:
        return False
    directory = trace_dir(cfg.experiment.run_dir or ".")
    install(Tracer(directory, role, cfg.trace.every_n_steps, cfg.trace.max_events))
    return True


def finish_trace(cfg: JobConfig) -> None:
    """Close the controller's tracer and merge every part file into ``<run_dir>/trace.json``. Runs
    after a failure too (from a ``finally``): a merge that fails is logged, never raised over the
    job's own error."""
    from areal_tasks.errors import TraceError
    from areal_tasks.trace.merge import merge_trace

    uninstall()
    try:
        merge_trace(cfg.experiment.run_dir or ".")
    except (TraceError, OSError) as exc:
        logger.warning("perf trace: merging the part files failed: %s", exc)
