"""What the SLURM backend writes and runs: the batch script of a job and the ``srun`` line of a step.

The batch script (:func:`render_batch_script`) is meant to be read by people: it is kept in the run
directory, one option per ``#SBATCH`` line, and it holds no secret (they reach the job through
``sbatch``'s environment, ``--export=ALL``; a command line with a secret in it is refused). It
asks for the job's nodes (whole nodes with ``--exclusive``: the steps then share them with
``--overlap``), GPUs per node through ``--gres``, ``--no-requeue`` unless ``slurm.requeue`` (a lost
node fails the job and the retry resumes from the last checkpoint), an ``EXIT`` trap that writes the
command's exit code atomically (SLURM forgets ended jobs after ``MinJobAge``; accounting is often
off), a ``TERM`` trap that keeps the shell waiting for the command's graceful stop, the
``slurm.setup`` lines, and then the job's command: normally the controller,
``<python> -m areal_tasks.cli train --config <config> ... cluster.scheduler=slurm``
(:func:`train_command`), which re-enters ``areal train`` inside the allocation.

Each worker is one step (:func:`srun_step_argv`) started by the controller on the batch host; with
``slurm.container_image`` the step runs in the container, through pyxis (``srun
--container-image``) or apptainer (``apptainer exec``), with the run directory mounted
(:func:`container_wrapping`). Neither runtime is packaged in Debian, so these lines are checked by
rendering only.
"""

from __future__ import annotations

import logging
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.errors import SchedulerError
from storage.redact import redact_argv

logger = logging.getLogger(__name__)

__all__ = [
    "BatchScript",
    "container_wrapping",
    "render_batch_script",
    "srun_step_argv",
    "train_command",
]

EXIT_FILE = "exit_code"
LOG_FILE = "job.log"


@dataclass(frozen=True)
class BatchScript:
    """Everything one job's batch script says (see :func:`render_batch_script`)."""

    name: str
    attempt: int
    attempt_dir: Path
    command: list[str]
    workdir: str
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_node: int | None = None
    memory_gb_per_node: float | None = None
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    #: who the job is for (``experiment/trial``), in the header comment.
    label: str = ""


def train_command(python: str, config: str, overrides: Sequence[str] = ()) -> list[str]:
    """``<python> -m areal_tasks.cli train --config <config> <overrides> cluster.scheduler=slurm``."""
    return [python, "-m", "areal_tasks.cli", "train", "--config", config, *overrides, "cluster.scheduler=slurm"]


def check_no_secret(argv: Sequence[str], what: str) -> None:
    """SchedulerError when ``argv`` shows a secret (what :func:`redact_argv` would mask)."""
    if list(redact_argv(list(argv))) != list(argv):
        raise SchedulerError(
            f"{what} holds a secret on its command line ({shlex.join(redact_argv(list(argv)))}); SLURM keeps "
            "scripts and command lines readable: pass secrets through the job's environment instead"
        )


def _sbatch_options(spec: BatchScript) -> list[tuple[str, str]]:
    """``(option, comment)`` pairs, in the order the script shows them."""
    s = spec.slurm
    opts: list[tuple[str, str]] = [
        (f"--job-name={spec.name}", "the job's name: status and retries find it by this"),
        (f"--nodes={spec.nodes}", "cluster.nodes"),
        ("--ntasks-per-node=1", "the batch step; workers are steps of their own"),
    ]
    if s.exclusive:
        opts.append(("--exclusive", "whole nodes: the workers' steps share them with --overlap"))
    if spec.gpus_per_node > 0:
        opts.append((f"--gres=gpu:{spec.gpus_per_node}", "cluster.gpus_per_node"))
    if spec.cpus_per_node is not None and not s.exclusive:
        opts.append((f"--cpus-per-task={spec.cpus_per_node}", "cluster.cpus_per_node"))
    if spec.memory_gb_per_node is not None:
        opts.append((f"--mem={math.ceil(spec.memory_gb_per_node * 1024)}M", "cluster.memory_gb_per_node"))
    for option, value in (("partition", s.partition), ("account", s.account), ("qos", s.qos), ("time", s.time_limit)):
        if value:
            opts.append((f"--{option}={value}", f"cluster.slurm.{'time_limit' if option == 'time' else option}"))
    if not s.requeue:
        opts.append(("--no-requeue", "a lost node fails the job; the retry resumes from the last checkpoint"))
    opts.append((f"--output={spec.attempt_dir / LOG_FILE}", "this attempt's log"))
    opts.append(("--open-mode=append", ""))
    opts.append((f"--chdir={spec.workdir}", "cluster.slurm.workdir"))
    opts += [(arg, "cluster.slurm.sbatch_args") for arg in s.sbatch_args]
    return opts


def render_batch_script(spec: BatchScript) -> str:
    """The batch script of ``spec`` (see the module docstring). SchedulerError if the command shows a secret."""
    if not spec.command:
        raise SchedulerError(f"job {spec.name}: the command is empty")
    check_no_secret(spec.command, f"the command of job {spec.name}")
    for line in spec.slurm.setup:
        if "\n" in line:
            raise SchedulerError(f"cluster.slurm.setup line {line!r} spans several lines; give one line per item")
    target = f" for {spec.label}" if spec.label else ""
    lines = [
        "#!/bin/bash",
        f"# areal job {spec.name}, attempt {spec.attempt}, written by areal_tasks.launch.slurm.script{target}.",
        "# Secrets are not in this file: they reach the job through sbatch's environment (--export=ALL).",
    ]
    options = _sbatch_options(spec)
    width = max(len(option) for option, _ in options) + len("#SBATCH ")
    for option, comment in options:
        text = f"#SBATCH {option}"
        lines.append(f"{text:<{width}}  # {comment}" if comment else text)
    if spec.slurm.container_image:
        lines.append(
            f"# Worker steps run in {spec.slurm.container_image} ({spec.slurm.container_runtime}); this script and "
            "the controller run on the batch host."
        )
    exit_file = spec.attempt_dir / EXIT_FILE
    temp = spec.attempt_dir / f".{EXIT_FILE}.tmp"
    trap = (
        f'rc=$?; (umask 077; printf "%s\\n" "$rc" > {shlex.quote(str(temp))}) && mv -f {shlex.quote(str(temp))} '
        f"{shlex.quote(str(exit_file))}"
    )
    lines += [
        "",
        "set -uo pipefail",
        "# the exit code, written atomically when the script ends (SLURM forgets ended jobs after MinJobAge)",
        f"trap {shlex.quote(trap)} EXIT",
        "# on SIGTERM (scancel --signal=TERM --full) the shell waits for the command's own graceful stop",
        "trap 'echo \"areal job: SIGTERM received; waiting for the command to stop\" >&2' TERM",
    ]
    if spec.slurm.setup:
        lines += ["", "# cluster.slurm.setup", *spec.slurm.setup]
    lines += ["", shlex.join(spec.command), ""]
    return "\n".join(lines)


def container_wrapping(
    slurm: SlurmConfig, run_dir: str | Path, cwd: str | None = None, gpus: int = 0
) -> tuple[list[str], list[str]]:
    """``(srun options, command prefix)`` that run a step in ``slurm.container_image`` (both empty without one).

    The run directory is always mounted at the same path; ``slurm.container_mounts`` (``src:dst``) add to it.
    """
    image = slurm.container_image
    if not image:
        return [], []
    mounts = [f"{run_dir}:{run_dir}", *slurm.container_mounts]
    if slurm.container_runtime == "pyxis":
        options = [f"--container-image={image}", f"--container-mounts={','.join(mounts)}"]
        if cwd:
            options.append(f"--container-workdir={cwd}")
        return options, []
    if slurm.container_runtime == "apptainer":
        prefix = ["apptainer", "exec"]
        if gpus > 0:
            prefix.append("--nv")
        if cwd:
            prefix += ["--pwd", cwd]
        return [], [*prefix, "--bind", ",".join(mounts), image]
    raise SchedulerError(
        f"cluster.slurm.container_runtime={slurm.container_runtime!r} is not one of 'pyxis', 'apptainer'"
    )


def srun_step_argv(
    *,
    job_id: str,
    node: str,
    name: str,
    log_path: str | Path,
    argv: Sequence[str],
    cpus: float = 1.0,
    gpus: int = 0,
    cwd: str | None = None,
    container: tuple[list[str], list[str]] = ([], []),
) -> list[str]:
    """The ``srun`` client line of one worker: one task on ``node`` inside allocation ``job_id``.

    ``--overlap`` lets the step share the (exclusive) allocation with the others; the client's exit
    code is the task's; ``--kill-on-bad-exit`` ends the step when its task fails; the environment is
    the client's (``--export=ALL``: it travels through ``Popen(env=)``, never argv).
    """
    options, prefix = container
    out = [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        f"--cpus-per-task={max(1, math.ceil(cpus))}",
    ]
    if gpus > 0:
        out.append(f"--gpus-per-task={gpus}")
    out += [
        "--kill-on-bad-exit=1",
        f"--job-name={name}",
        f"--output={log_path}",
        "--open-mode=append",
        "--export=ALL",
    ]
    if cwd:
        out.append(f"--chdir={cwd}")
    return [*out, *options, *prefix, *argv]
