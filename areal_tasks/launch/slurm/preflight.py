"""The live checks of a SLURM job before anything starts: the partition, the job's shape, the report.

* ``scontrol show partition P -o``: the partition exists and its ``State`` is ``UP`` (with no
  partition given, the cluster's default one is checked);
* ``sbatch --test-only --nodes=N -p P [--gres=gpu:G] [--account A] [--qos Q] --wrap true``: SLURM's
  own verdict on the node count, GPUs per node, account and QOS; a refusal becomes the message;
* ``sinfo -h -p P -o "%D %c %m %G %T"``: nodes, CPUs, memory, GRES and state, for the report.

Everything runs through :func:`~areal_tasks.launch.slurm.commands.run_slurm` from the submit host;
no job is started.
"""

from __future__ import annotations

import logging
from typing import Any

from areal_tasks.config.cluster import SlurmConfig
from areal_tasks.errors import SchedulerError
from areal_tasks.launch.slurm.commands import parse_key_values, parse_rows, resolve_slurm_conf, run_slurm

logger = logging.getLogger(__name__)

__all__ = ["default_partition", "preflight"]


def default_partition(slurm_conf: str) -> str:
    """The cluster's default partition (``Default=YES``); SchedulerError when there is none."""
    done = run_slurm(["scontrol", "show", "partition", "-o"], slurm_conf=slurm_conf)
    partitions = [parse_key_values(line) for line in done.stdout.splitlines() if line.strip()]
    for fields in partitions:
        if fields.get("Default") == "YES":
            return fields["PartitionName"]
    names = ", ".join(p.get("PartitionName", "?") for p in partitions) or "none"
    raise SchedulerError(
        f"the SLURM cluster has no default partition (partitions: {names}); set cluster.slurm.partition"
    )


def preflight(slurm: SlurmConfig, *, nodes: int = 1, gpus_per_node: int = 0) -> dict[str, Any]:
    """Check that SLURM would run a job of ``nodes`` nodes (and GPUs) now; return a small report.

    Raises SchedulerError naming the partition and SLURM's own message when it would not.
    """
    conf = resolve_slurm_conf(slurm.slurm_conf)
    partition = slurm.partition or default_partition(conf)
    shown = run_slurm(["scontrol", "show", "partition", partition, "-o"], slurm_conf=conf, check=False)
    if shown.returncode != 0:
        message = (shown.stderr.strip() or shown.stdout.strip()).replace("\n", "; ")
        raise SchedulerError(
            f"SLURM partition {partition!r} does not exist ({message}); set cluster.slurm.partition to one of "
            "`sinfo -s`'s partitions"
        )
    fields = parse_key_values(shown.stdout.strip())
    if fields.get("State") != "UP":
        raise SchedulerError(
            f"SLURM partition {partition!r} is {fields.get('State', 'in an unknown state')}, not UP; jobs would "
            "wait there: ask the cluster's admin, or pick another partition"
        )
    test = ["sbatch", "--test-only", f"--nodes={nodes}", f"--partition={partition}"]
    if gpus_per_node > 0:
        test.append(f"--gres=gpu:{gpus_per_node}")
    if slurm.account:
        test.append(f"--account={slurm.account}")
    if slurm.qos:
        test.append(f"--qos={slurm.qos}")
    if slurm.time_limit:
        test.append(f"--time={slurm.time_limit}")
    if slurm.exclusive:
        test.append("--exclusive")
    test += ["--wrap", "true"]
    verdict = run_slurm(test, slurm_conf=conf, check=False)
    if verdict.returncode != 0:
        message = (verdict.stderr.strip() or verdict.stdout.strip()).replace("\n", "; ")
        raise SchedulerError(
            f"SLURM refuses a job of {nodes} node(s)"
            + (f" with {gpus_per_node} GPU(s) each" if gpus_per_node else "")
            + f" in partition {partition!r}: {message}; lower cluster.nodes/gpus_per_node or pick another "
            "partition/account"
        )
    info = run_slurm(["sinfo", "-h", "-p", partition, "-o", "%D|%c|%m|%G|%T"], slurm_conf=conf)
    rows = parse_rows(info.stdout, ("nodes", "cpus", "memory_mb", "gres", "state"))
    report = {
        "scheduler": "slurm",
        "slurm_conf": conf,
        "partition": partition,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "test_only": (verdict.stderr.strip() or verdict.stdout.strip()),
        "sinfo": rows,
        "ok": True,
    }
    logger.info("SLURM preflight: partition %s accepts %d node(s): %s", partition, nodes, report["test_only"])
    return report
