"""The ``cluster`` section: which scheduler runs the job, on how many nodes, and each scheduler's own settings.

``cluster.scheduler`` picks the backend (``local``, ``ray``, ``slurm``); ``cluster.ray`` and
``cluster.slurm`` hold what only that backend reads, and ``cluster.skypilot`` what
``areal launch skypilot`` writes into a SkyPilot task (SkyPilot provisions the machines, then runs
the job on them with the Ray scheduler). :func:`check_cluster` holds the static checks; the live
ones (the partition exists, the Ray cluster has the resources) run before anything starts, in
each backend's preflight. Torch-free plain dataclasses.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from areal_tasks.config.checks import Problems

logger = logging.getLogger(__name__)

__all__ = ["ClusterConfig", "RayConfig", "SkyPilotConfig", "SlurmConfig", "check_cluster", "check_skypilot"]

#: SLURM's ``--time`` forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes and days-hours:minutes:seconds.
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$")
#: a Ray GCS address: ``auto`` or ``host:port``.
_RAY_ADDRESS = re.compile(r"^(auto|[A-Za-z0-9_.\-\[\]:]+:\d{1,5})$")


@dataclass
class RayConfig:
    """Read by the Ray scheduler (``cluster.scheduler: ray``)."""

    #: the Ray cluster (GCS) the controller joins, as a node of that cluster: ``auto`` finds the
    #: local node's cluster; or ``host:port``.
    address: str = "auto"
    #: the Jobs API (dashboard) URL used to submit the job from outside the cluster, e.g.
    #: ``http://head:8265``; None = ``$RAY_API_SERVER_ADDRESS``, else ``http://127.0.0.1:8265``.
    dashboard_url: str | None = None
    #: Ray namespace of the job's actors; None = ``areal-<experiment>-<trial>``.
    namespace: str | None = None
    #: seconds to wait for the job's placement group (one bundle per node) before failing with
    #: what the cluster has against what was asked.
    placement_timeout_s: float = 120.0
    #: seconds any one call to a worker's supervisor actor may take.
    call_timeout_s: float = 60.0
    #: the Python interpreter as the nodes see it; None = this interpreter.
    python: str | None = None
    #: the project directory as the nodes see it (the job's working directory); None = the current one.
    workdir: str | None = None


@dataclass
class SlurmConfig:
    """Read by the SLURM scheduler (``cluster.scheduler: slurm``) and its batch script."""

    #: partition (``--partition``); None = the cluster's default partition.
    partition: str | None = None
    #: account to charge (``--account``).
    account: str | None = None
    #: quality of service (``--qos``).
    qos: str | None = None
    #: wall-clock limit (``--time``), e.g. ``2-00:00:00`` or ``90``; None = the partition's.
    time_limit: str | None = None
    #: allocate whole nodes (``--exclusive``); the job's steps then share them with ``--overlap``.
    exclusive: bool = True
    #: let SLURM requeue the job when a node fails. Off by default: a lost node fails the job, and
    #: the retry (Airflow's, or yours) resumes from the last checkpoint, which SLURM cannot know.
    requeue: bool = False
    #: shell lines run before the job in the batch script (``module load ...``, ``source venv/bin/activate``).
    setup: list[str] = field(default_factory=list)
    #: extra ``#SBATCH`` options, each one option, e.g. ``--constraint=h100``.
    sbatch_args: list[str] = field(default_factory=list)
    #: run every step in this container image; None = on the node's own environment.
    container_image: str | None = None
    #: how to run the container: ``pyxis`` (``srun --container-image``) or ``apptainer`` (``apptainer exec``).
    container_runtime: Literal["pyxis", "apptainer"] = "pyxis"
    #: extra ``src:dst`` mounts into the container (the run directory is always mounted).
    container_mounts: list[str] = field(default_factory=list)
    #: the Python interpreter as the nodes see it; None = this interpreter.
    python: str | None = None
    #: the project directory as the nodes see it; None = the current one.
    workdir: str | None = None
    #: path of ``slurm.conf`` for the SLURM commands; None = ``$SLURM_CONF``, else ``/etc/slurm/slurm.conf``.
    slurm_conf: str | None = None


@dataclass
class SkyPilotConfig:
    """Read by ``areal launch skypilot``, which writes a SkyPilot task for the job."""

    #: cloud to launch on (``aws``, ``gcp``, ``kubernetes``...); None = SkyPilot's choice.
    cloud: str | None = None
    #: region; None = SkyPilot's choice.
    region: str | None = None
    #: accelerator type for ``cluster.gpus_per_node`` GPUs, e.g. ``H100``; required when that is > 0.
    accelerator: str | None = None
    #: use spot instances.
    use_spot: bool = False
    #: shell lines run on every node after the project is installed.
    setup: list[str] = field(default_factory=list)
    #: port of the job's own Ray cluster on the nodes (SkyPilot runs its own Ray on 6380).
    ray_port: int = 6379


@dataclass
class ClusterConfig:
    """The machines the job runs on."""

    #: who starts worker processes: ``local`` (this machine), ``ray`` or ``slurm``. ``skypilot`` is a
    #: launcher, not a scheduler: ``areal launch skypilot`` writes a task that runs the job with ``ray``.
    scheduler: Literal["local", "ray", "slurm", "skypilot"] = "local"
    #: number of nodes; more than one needs ``ray`` or ``slurm``, a shared ``experiment.run_dir`` and
    #: shared storage.
    nodes: int = 1
    #: GPUs per node; 0 = CPU-only (allocation world sizes then count worker processes).
    gpus_per_node: int = 0
    #: CPU cores per node to request; None = scheduler default.
    cpus_per_node: int | None = None
    #: memory per node to request, in GiB; None = scheduler default.
    memory_gb_per_node: float | None = None
    #: settings of the Ray scheduler.
    ray: RayConfig = field(default_factory=RayConfig)
    #: settings of the SLURM scheduler.
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    #: settings of ``areal launch skypilot``.
    skypilot: SkyPilotConfig = field(default_factory=SkyPilotConfig)


#: ports of SkyPilot's own Ray cluster on the nodes it provisions (``sky.skylet.constants``:
#: ``SKY_REMOTE_RAY_PORT``, ``SKY_REMOTE_RAY_DASHBOARD_PORT``; SkyPilot 0.14).
SKYPILOT_OWN_PORTS = (6380, 8266)

#: schedulers that can place workers on more than one node.
MULTI_NODE_SCHEDULERS = ("ray", "slurm")


def check_cluster(p: Problems, cluster: ClusterConfig) -> None:
    """The static checks of the ``cluster`` section (numbers, formats, sections that do not apply)."""
    p.number("cluster.nodes", cluster.nodes, low=1, cap=100_000)
    p.number("cluster.gpus_per_node", cluster.gpus_per_node, low=0, cap=1024)
    p.number("cluster.cpus_per_node", cluster.cpus_per_node, low=1, cap=100_000, optional=True)
    p.number("cluster.memory_gb_per_node", cluster.memory_gb_per_node, low=0, low_open=True, optional=True)
    if cluster.scheduler not in MULTI_NODE_SCHEDULERS and isinstance(cluster.nodes, int) and cluster.nodes > 1:
        p.add(
            "cluster.nodes",
            f"the {cluster.scheduler} scheduler runs on one node, got nodes={cluster.nodes}; several nodes need "
            f"cluster.scheduler={' or '.join(MULTI_NODE_SCHEDULERS)}",
        )
    ray, slurm, sky = cluster.ray, cluster.slurm, cluster.skypilot
    if not isinstance(ray.address, str) or not _RAY_ADDRESS.match(ray.address):
        p.add(
            "cluster.ray.address", f"must be 'auto' or 'host:port' (the Ray GCS, e.g. head:6379), got {ray.address!r}"
        )
    if ray.dashboard_url is not None and not str(ray.dashboard_url).startswith(("http://", "https://")):
        p.add(
            "cluster.ray.dashboard_url",
            f"must be an http(s) URL of the Ray dashboard (e.g. http://head:8265), got {ray.dashboard_url!r}",
        )
    p.number("cluster.ray.placement_timeout_s", ray.placement_timeout_s, low=0, low_open=True, cap=86_400)
    p.number("cluster.ray.call_timeout_s", ray.call_timeout_s, low=0, low_open=True, cap=86_400)
    for path, value in (("cluster.ray.namespace", ray.namespace), ("cluster.ray.python", ray.python)):
        p.non_empty(path, value, optional=True)
    if slurm.time_limit is not None and not _SLURM_TIME.match(str(slurm.time_limit)):
        p.add(
            "cluster.slurm.time_limit",
            f"{slurm.time_limit!r} is not a SLURM time: use minutes, HH:MM:SS or D-HH:MM:SS (e.g. 2-00:00:00)",
        )
    for name in ("partition", "account", "qos", "container_image", "python", "slurm_conf"):
        p.non_empty(f"cluster.slurm.{name}", getattr(slurm, name), optional=True)
    for index, arg in enumerate(slurm.sbatch_args):
        if not isinstance(arg, str) or not arg.startswith("--") or "\n" in arg:
            p.add(
                f"cluster.slurm.sbatch_args[{index}]",
                f"each item is one long option on one line (e.g. '--constraint=h100'), got {arg!r}",
            )
    for index, line in enumerate(slurm.setup):
        if not isinstance(line, str) or "\n" in line:
            p.add(f"cluster.slurm.setup[{index}]", f"each item is one shell line, got {line!r}")
    for index, mount in enumerate(slurm.container_mounts):
        if not isinstance(mount, str) or ":" not in mount or "," in mount:
            p.add(f"cluster.slurm.container_mounts[{index}]", f"must be 'src:dst' (no commas), got {mount!r}")
    p.number("cluster.skypilot.ray_port", sky.ray_port, low=1024, high=65535)
    if sky.ray_port in SKYPILOT_OWN_PORTS:
        p.add(
            "cluster.skypilot.ray_port",
            f"{sky.ray_port} is taken by SkyPilot's own Ray on the nodes (GCS 6380, dashboard 8266); pick "
            "another (default 6379)",
        )
    _warn_unused_sections(cluster)


def check_skypilot(p: Problems, cluster: ClusterConfig) -> None:
    """The checks only ``areal launch skypilot`` needs (the task it writes asks SkyPilot for the machines):
    an accelerator type for the GPUs, and one shell line per setup item. The rest of the config is
    validated as for the ray scheduler, which runs the job on the machines SkyPilot provisions."""
    sky = cluster.skypilot
    if isinstance(cluster.gpus_per_node, int) and cluster.gpus_per_node > 0 and not sky.accelerator:
        p.add(
            "cluster.skypilot.accelerator",
            f"required with cluster.gpus_per_node={cluster.gpus_per_node}: the accelerator type SkyPilot asks "
            "the cloud for, e.g. H100 or A100-80GB",
        )
    for path, value in (
        ("cluster.skypilot.accelerator", sky.accelerator),
        ("cluster.skypilot.cloud", sky.cloud),
        ("cluster.skypilot.region", sky.region),
    ):
        p.non_empty(path, value, optional=True)
        if isinstance(value, str) and value.strip() and not re.match(r"^[A-Za-z0-9_.\-]+$", value):
            p.add(path, f"must be a plain name (letters, digits, '_', '.', '-'), got {value!r}")
    for index, line in enumerate(sky.setup):
        if not isinstance(line, str) or "\n" in line:
            p.add(f"cluster.skypilot.setup[{index}]", f"each item is one shell line, got {line!r}")


def _warn_unused_sections(cluster: ClusterConfig) -> None:
    """A section set for a scheduler the job does not use is probably a mistake: say so (not an error)."""
    users = {"ray": ("ray", "skypilot"), "slurm": ("slurm",)}  # a SkyPilot task runs the job with ray
    for kind, section, default in (("ray", cluster.ray, RayConfig()), ("slurm", cluster.slurm, SlurmConfig())):
        if cluster.scheduler in users[kind]:
            continue
        changed = [f.name for f in fields(section) if getattr(section, f.name) != getattr(default, f.name)]
        if changed:
            logger.warning(
                "cluster.%s sets %s but cluster.scheduler is %r: these settings are not used",
                kind,
                ", ".join(changed),
                cluster.scheduler,
            )
