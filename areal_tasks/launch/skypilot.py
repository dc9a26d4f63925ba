"""The SkyPilot task of a job: ``areal launch skypilot --config FILE [overrides] [-o task.yaml]``.

SkyPilot is a launcher, not a scheduler: it provisions ``cluster.nodes`` machines, syncs the project
(``workdir``) to each, runs ``setup`` and then ``run`` on every node. The ``run`` section starts a
Ray cluster of the job's own (head on node rank 0, on ``cluster.skypilot.ray_port``, because
SkyPilot's own Ray already uses 6380 and 8266 on the nodes) and runs ``areal train`` on the head
with ``cluster.scheduler=ray`` against it; the other nodes start a Ray node that joins the head and
return (the Ray scheduler waits for the nodes it needs). Nothing calls ``ray stop``, which would stop
SkyPilot's own Ray too; ``sky down`` ends everything.

The task is plain data written with plain Python (SkyPilot is never imported: its pins do not fit
the project's lock). What it holds:

* ``resources``: ``cpus``/``memory`` as minimums (``"8+"``), ``accelerators: <type>:<gpus_per_node>``,
  ``cloud``, ``region``, ``use_spot`` from ``cluster`` and ``cluster.skypilot``;
* ``file_mounts``: an ``s3://`` or ``gs://`` ``storage.url`` mounted at :data:`STORAGE_MOUNT`, and the
  job's ``storage.url`` rewritten to the mount;
* ``envs``: public values only (the config's path inside the workdir);
* ``secrets``: the *names* of what must be given at launch (``sky launch --secret NAME`` takes the
  value from the local environment): ``AREAL_CONFIG_SECRETS`` and, for S3, the AWS keys. No secret
  value is ever written; an override that carries one is refused with where to put it instead.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from areal_tasks.config.secrets import SECRETS_ENV, split_secret_overrides
from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["STORAGE_MOUNT", "check_skypilot_config", "render_task_yaml", "skypilot_task"]

#: where an object-store ``storage.url`` is mounted on every node.
STORAGE_MOUNT = "/areal/storage"
#: the project's extras installed on every node (``cluster`` is the pinned ``ray[default]``: the ``ray`` command).
SETUP_EXTRAS = "train,serve,storage,cluster"
#: storage URL schemes SkyPilot can mount.
MOUNTABLE_SCHEMES = ("s3://", "gs://")
#: the variables a job reading S3 takes its credentials from.
AWS_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def check_skypilot_config(cfg: JobConfig) -> None:
    """ConfigError naming every problem of the ``cluster.skypilot`` settings for this job."""
    from areal_tasks.config.build import format_problems
    from areal_tasks.config.checks import Problems
    from areal_tasks.config.cluster import check_skypilot

    problems = Problems()
    check_skypilot(problems, cfg.cluster)
    if problems.items:
        raise ConfigError(format_problems(problems.items, "cannot write the SkyPilot task"))


def skypilot_task(
    cfg: JobConfig, config_path: str | Path, overrides: list[str], workdir: str | Path | None = None
) -> dict[str, Any]:
    """The task (a dict in SkyPilot's YAML schema) running ``cfg`` on ``cluster.nodes`` SkyPilot nodes.

    ``cfg`` is the job's config validated as for the ray scheduler; ``config_path`` and the public
    ``overrides`` are what the nodes load it from (the path must lie inside ``workdir``, default the
    repository holding ``areal_tasks``, which SkyPilot syncs to every node).
    """
    from areal_tasks.launch.submit import job_name

    check_skypilot_config(cfg)
    public, secret = split_secret_overrides(overrides)
    if secret:
        raise ConfigError(
            f"{len(secret)} override(s) carry a secret, and a SkyPilot task file holds none: put the values in "
            f"${SECRETS_ENV} (JSON of dotted paths to values) and give it with `sky launch --secret {SECRETS_ENV}`"
        )
    root = Path(workdir) if workdir is not None else _repo_root()
    root = root.resolve()
    config_file = Path(config_path).resolve()
    try:
        relative = config_file.relative_to(root)
    except ValueError:
        raise ConfigError(
            f"the config {config_file} is outside the workdir {root}, which is all SkyPilot syncs to the nodes; "
            "put the config file under it"
        ) from None
    cluster, sky = cfg.cluster, cfg.cluster.skypilot
    resources: dict[str, Any] = {}
    if cluster.cpus_per_node is not None:
        resources["cpus"] = f"{cluster.cpus_per_node}+"
    if cluster.memory_gb_per_node is not None:
        resources["memory"] = f"{cluster.memory_gb_per_node:g}+"
    if cluster.gpus_per_node > 0:
        resources["accelerators"] = f"{sky.accelerator}:{cluster.gpus_per_node}"
    if sky.cloud:
        resources["cloud"] = sky.cloud
    if sky.region:
        resources["region"] = sky.region
    resources["use_spot"] = bool(sky.use_spot)

    storage_url = cfg.storage.url or ""
    job_overrides = list(public)
    file_mounts: dict[str, Any] = {}
    secrets: dict[str, None] = {}
    if storage_url.startswith(MOUNTABLE_SCHEMES):
        file_mounts[STORAGE_MOUNT] = {"source": storage_url.rstrip("/"), "mode": "MOUNT"}
        job_overrides.append(f"storage.url=file://{STORAGE_MOUNT}")
        if storage_url.startswith("s3://"):
            secrets.update(dict.fromkeys(AWS_SECRETS))
    secrets[SECRETS_ENV] = None
    if cluster.nodes > 1 and not file_mounts:
        logger.warning(
            "%d nodes with storage.url=%s: every node must see the same storage and run directory; use an "
            "s3:// or gs:// storage.url (mounted at %s) or mount a shared filesystem in cluster.skypilot.setup",
            cluster.nodes,
            storage_url or "(default, node-local)",
            STORAGE_MOUNT,
        )

    task: dict[str, Any] = {
        "name": job_name(cfg),
        "num_nodes": cluster.nodes,
        "resources": resources,
        "workdir": str(root),
    }
    if file_mounts:
        task["file_mounts"] = file_mounts
    task["envs"] = {"AREAL_CONFIG": str(relative), "RAY_USAGE_STATS_ENABLED": "0"}
    task["secrets"] = secrets
    task["setup"] = _setup(sky.setup)
    task["run"] = _run(sky.ray_port, job_overrides)
    return task


def render_task_yaml(task: dict[str, Any]) -> str:
    """The task as YAML, with ``setup`` and ``run`` as literal blocks (readable scripts)."""
    header = "# SkyPilot task written by `areal launch skypilot`; start it with `sky launch` (see docs/clusters.md)\n"
    return header + yaml.dump(task, Dumper=_TaskDumper, sort_keys=False, default_flow_style=False, width=120)


def _setup(lines: list[str]) -> str:
    script = [
        "set -euo pipefail",
        f"pip install -c constraints.txt -e '.[{SETUP_EXTRAS}]'",
        *lines,
    ]
    return "\n".join(script) + "\n"


def _run(ray_port: int, overrides: list[str]) -> str:
    train = " ".join(
        [
            'python -m areal_tasks.cli train --config "$AREAL_CONFIG"',
            *(shlex.quote(o) for o in overrides),
            "cluster.scheduler=ray",
            f"cluster.ray.address=127.0.0.1:{ray_port}",
            'cluster.nodes="$SKYPILOT_NUM_NODES"',
        ]
    )
    # a node of the job's Ray already runs here (a re-run on the same nodes): reuse it
    up = f'ps aux | grep -q "[r]ay.*[:=]{ray_port}"'
    script = [
        "set -eu",
        'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
        "# the job's own Ray (never `ray stop` here: it would also stop SkyPilot's Ray on 6380)",
        'if [ "$SKYPILOT_NODE_RANK" = 0 ]; then',
        f'  {up} || ray start --head --port={ray_port} --node-ip-address="$HEAD" --disable-usage-stats',
        f"  {train}",
        "else",
        f'  {up} || ray start --address="$HEAD:{ray_port}" --disable-usage-stats',
        "fi",
    ]
    return "\n".join(script) + "\n"


def _repo_root() -> Path:
    import areal_tasks

    return Path(areal_tasks.__file__).resolve().parents[1]


class _TaskDumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings as ``|`` blocks."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_TaskDumper.add_representer(str, _str_representer)
