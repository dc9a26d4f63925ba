"""The Scheduler interface: the one thing in the system that starts and stops processes.

Inference servers, train workers (one process per rank, torch.distributed) and probe processes are
all described by a :class:`WorkerGroupSpec` and handed to a :class:`Scheduler`. The interface is
written so that every backend fits behind it:

* ``local`` (``areal_tasks.launch.local.LocalScheduler``): subprocesses of the controller, each in
  its own process group, all on one node; ``WorkerInfo.pid`` is set, ``host`` is ``127.0.0.1``.
* ``ray`` (``areal_tasks.launch.ray``): one supervisor actor per worker in one job-wide placement
  group, a bundle per node; ``job_id`` is the actor id, ``host`` the node's address.
* ``slurm`` (``areal_tasks.launch.slurm``): one ``srun`` step per worker inside the job's
  allocation; ``job_id`` is ``"<jobid>.<step>"``, ``host`` the node's address.

Nodes. A scheduler owns an ordered list of nodes (:meth:`Scheduler.nodes`, :class:`NodeInfo`).
``WorkerGroupSpec.placement`` gives the node index of every rank (``None``: all on node 0), so one
placement plan (``areal_tasks.launch.placement``) serves every backend.

Backends differ in how they place and launch workers, never in what the spec means: the
placeholders, the readiness contract, the torch.distributed environment and the status life cycle
below are the same everywhere.

Placeholders. ``command`` items, ``env`` values, ``cwd`` and the readiness target may contain
``{port}`` (the worker's first port), ``{port_0}``, ``{port_1}``... (each of its
``ports_per_worker`` ports), ``{rank}``, ``{world_size}``, ``{host}`` (the address of the worker's
node), ``{node}`` (its node index), ``{run_dir}``, ``{group}`` and, with ``torch_distributed=True``,
``{master_port}``. Any other ``{...}`` text is left untouched, so ``python -c "d = {'a': 1}"``
needs no escaping.

Environment. Every worker gets :data:`NODE_ADDR_ENV` (its node's address). With
``torch_distributed=True`` it also gets ``MASTER_ADDR`` (rank 0's node), ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``, ``NODE_RANK`` (the index of its node among the group's nodes, in placement order),
and ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` counted among the group's ranks on the same node.

This module is torch-free.
"""

from __future__ import annotations

import enum
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

from areal_tasks.errors import ConfigError

__all__ = [
    "NODE_ADDR_ENV",
    "OWN_DEVICES_ENV",
    "PLACEHOLDER_NAMES",
    "NodeInfo",
    "ReadinessCheck",
    "Scheduler",
    "WorkerGroupSpec",
    "WorkerInfo",
    "WorkerStatus",
    "expand_placeholders",
    "local_device_index",
    "torch_distributed_env",
]

#: set by a scheduler that gave a worker accelerators: the first ``n`` ids of its
#: ``CUDA_VISIBLE_DEVICES`` are its own; the ids after them are the host's other devices, visible
#: only so that NCCL can reach them directly (peer-to-peer over NVLink) in weight updates.
OWN_DEVICES_ENV = "AREAL_OWN_DEVICES"

#: set by every scheduler for every worker: the address of the node it runs on (where its ports are).
NODE_ADDR_ENV = "AREAL_NODE_ADDR"


def local_device_index() -> int:
    """The CUDA device index this worker computes on.

    ``0`` (its first own device) under a scheduler that set :data:`OWN_DEVICES_ENV`; otherwise
    ``LOCAL_RANK`` (torchrun's convention: every rank sees all devices and takes its own index).
    """
    if os.environ.get(OWN_DEVICES_ENV):
        return 0
    return int(os.environ.get("LOCAL_RANK", "0"))


#: placeholder names a backend fills in per worker (``port_<i>`` is matched separately).
PLACEHOLDER_NAMES = frozenset({"port", "rank", "world_size", "host", "node", "run_dir", "group", "master_port"})

_PLACEHOLDER = re.compile(r"\{(port_\d+|[a-z_]+)\}")
_GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def expand_placeholders(template: str, values: Mapping[str, object]) -> str:
    """Replace every ``{name}`` in ``template`` whose name is a key of ``values``.

    Names absent from ``values`` are left as they are (literal braces need no escaping).
    """

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        return str(values[name]) if name in values else match.group(0)

    return _PLACEHOLDER.sub(substitute, template)


ReadinessKind = Literal["http", "file", "none"]


@dataclass(frozen=True)
class ReadinessCheck:
    """How a scheduler decides that a started worker is ready to serve.

    * ``http``: ``target`` is a URL template (e.g. ``http://{host}:{port}/health``); ready when a GET
      answers ``expect_status``.
    * ``file``: ``target`` is a path template the worker creates once ready; a relative path is
      taken relative to the worker's ``cwd``. A stale file is removed before the worker starts.
    * ``none``: ready as soon as the process has been started.
    """

    kind: ReadinessKind = "none"
    target: str = ""
    expect_status: int = 200
    interval_s: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in ("http", "file", "none"):
            raise ConfigError(f"ReadinessCheck.kind={self.kind!r} is not one of 'http', 'file', 'none'")
        if self.kind == "http" and not self.target.startswith(("http://", "https://")):
            raise ConfigError(
                f"ReadinessCheck.target={self.target!r} must be an http(s) URL template for kind 'http', "
                "e.g. 'http://{host}:{port}/health'"
            )
        if self.kind == "file" and not self.target:
            raise ConfigError("ReadinessCheck.target must be a path template for kind 'file'")
        if self.interval_s <= 0:
            raise ConfigError(f"ReadinessCheck.interval_s={self.interval_s!r} must be > 0")

    @classmethod
    def http(cls, url: str = "http://{host}:{port}/health", expect_status: int = 200) -> ReadinessCheck:
        """Ready when GET ``url`` (a template) answers ``expect_status``."""
        return cls(kind="http", target=url, expect_status=expect_status)

    @classmethod
    def file(cls, path: str) -> ReadinessCheck:
        """Ready when the file at ``path`` (a template) exists."""
        return cls(kind="file", target=path)

    @classmethod
    def none(cls) -> ReadinessCheck:
        """Ready once started (batch jobs, probes)."""
        return cls(kind="none")


@dataclass(frozen=True)
class NodeInfo:
    """One node of a scheduler's allocation, in placement order (``index`` 0 first).

    ``address`` is where the node's workers are reached (and ports picked); ``name`` is its host
    name as the cluster knows it (SLURM node name, Ray node hostname); ``cpus`` and ``gpus`` are what
    this job may use there.
    """

    index: int
    name: str
    address: str
    cpus: float
    gpus: int

    @property
    def label(self) -> str:
        """``node 1 (n1, 10.0.0.11)``: how messages name the node."""
        return f"node {self.index} ({self.name}, {self.address})"


@dataclass
class WorkerGroupSpec:
    """A group of identical workers, one process each, ranked ``0..replicas-1``.

    ``devices_per_worker``: accelerators each worker gets; the LocalScheduler hands out ids from the
    pool it owns and sets ``CUDA_VISIBLE_DEVICES`` to the worker's own ids followed by the pool's
    other ids, with :data:`OWN_DEVICES_ENV` saying how many are its own: ``cuda:0`` is the worker's
    device, and NCCL can still use the direct GPU-to-GPU path to the others (hiding them keeps it
    off that path). With ``0`` the variable is left as inherited, unless ``hide_devices=True``,
    which sets it to the empty string (a CPU-only worker on a GPU host).

    ``shared_devices`` (colocation): per rank, the ids of devices another running group already
    holds, which this group's workers share instead of taking ``devices_per_worker`` new ones from
    the pool (each list must have that length); they stay the other group's and go back to the
    pool only with it.

    ``placement``: the node index (into :meth:`Scheduler.nodes`) of every rank, one per replica;
    ``None`` puts every rank on node 0. ``cpus_per_worker``: CPU cores each worker reserves on a
    cluster backend (a Ray actor's ``num_cpus``, ``srun --cpus-per-task``); the local scheduler does
    not reserve cores.

    ``torch_distributed=True`` adds ``MASTER_ADDR``, ``MASTER_PORT`` (one free port on rank 0's node
    shared by the group), ``RANK``, ``WORLD_SIZE``, ``NODE_RANK``, ``LOCAL_RANK`` and
    ``LOCAL_WORLD_SIZE`` to every worker's env (see :func:`torch_distributed_env`).
    """

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    ports_per_worker: int = 1
    devices_per_worker: int = 0
    hide_devices: bool = False
    shared_devices: list[list[str]] | None = None
    readiness: ReadinessCheck = field(default_factory=ReadinessCheck.none)
    ready_timeout_s: float = 300.0
    cwd: str | None = None
    torch_distributed: bool = False
    placement: list[int] | None = None
    cpus_per_worker: float = 1.0

    def __post_init__(self) -> None:
        if not _GROUP_NAME.match(self.name or ""):
            raise ConfigError(
                f"WorkerGroupSpec.name={self.name!r} is invalid: use letters, digits, '_', '.', '-' "
                "(it names the log folder)"
            )
        if not self.command or not all(isinstance(part, str) for part in self.command):
            raise ConfigError(f"WorkerGroupSpec.command={self.command!r} must be a non-empty list of str")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise ConfigError(f"WorkerGroupSpec.env of group {self.name!r} must map str to str")
        for field_name, minimum in (("replicas", 1), ("ports_per_worker", 0), ("devices_per_worker", 0)):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < minimum:
                raise ConfigError(f"WorkerGroupSpec.{field_name}={value!r} must be an int >= {minimum}")
        if self.shared_devices is not None and (
            len(self.shared_devices) != self.replicas
            or any(len(ids) != self.devices_per_worker for ids in self.shared_devices)
        ):
            raise ConfigError(
                f"group {self.name!r}: shared_devices={self.shared_devices!r} must hold one list of "
                f"devices_per_worker={self.devices_per_worker} ids per replica ({self.replicas})"
            )
        if self.readiness.kind == "http" and self.ports_per_worker < 1 and "{port" in self.readiness.target:
            raise ConfigError(
                f"group {self.name!r}: http readiness uses a port placeholder but ports_per_worker=0; "
                "set ports_per_worker >= 1"
            )
        if self.ready_timeout_s <= 0:
            raise ConfigError(f"WorkerGroupSpec.ready_timeout_s={self.ready_timeout_s!r} must be > 0")
        if self.placement is not None and (
            len(self.placement) != self.replicas
            or not all(isinstance(node, int) and not isinstance(node, bool) and node >= 0 for node in self.placement)
        ):
            raise ConfigError(
                f"group {self.name!r}: placement={self.placement!r} must hold one node index (an int >= 0) "
                f"per replica ({self.replicas})"
            )
        if not isinstance(self.cpus_per_worker, (int, float)) or self.cpus_per_worker <= 0:
            raise ConfigError(f"WorkerGroupSpec.cpus_per_worker={self.cpus_per_worker!r} must be a number > 0")

    def node_of(self, rank: int) -> int:
        """The node index of ``rank`` (0 when the spec has no placement)."""
        return 0 if self.placement is None else self.placement[rank]


def torch_distributed_env(spec: WorkerGroupSpec, rank: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The torch.distributed variables of ``rank`` of ``spec``: the same on every backend.

    ``NODE_RANK`` numbers the group's nodes in the order their first rank appears; ``LOCAL_RANK``
    counts the ranks before this one on the same node, ``LOCAL_WORLD_SIZE`` all of them there.
    """
    nodes = [spec.node_of(r) for r in range(spec.replicas)]
    node = nodes[rank]
    node_order = list(dict.fromkeys(nodes))
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "WORLD_SIZE": str(spec.replicas),
        "NODE_RANK": str(node_order.index(node)),
        "LOCAL_RANK": str(nodes[:rank].count(node)),
        "LOCAL_WORLD_SIZE": str(nodes.count(node)),
    }


class WorkerStatus(enum.Enum):
    """Life cycle of one worker: PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | STOPPED."""

    PENDING = "pending"  # accepted, not yet launched (queued on a cluster backend)
    STARTING = "starting"  # launched, not yet ready
    RUNNING = "running"  # ready
    SUCCEEDED = "succeeded"  # exited with code 0 on its own
    FAILED = "failed"  # exited non-zero (or was killed) without being asked to stop
    STOPPED = "stopped"  # stopped by the scheduler

    @property
    def is_terminal(self) -> bool:
        """Whether the worker has exited (for whatever reason)."""
        return self in (WorkerStatus.SUCCEEDED, WorkerStatus.FAILED, WorkerStatus.STOPPED)


@dataclass
class WorkerInfo:
    """A snapshot of one worker. ``pid`` is set by process-based backends, ``job_id`` by cluster ones.

    ``exit_code`` follows ``subprocess`` conventions: negative means killed by that signal.
    ``log_path`` is where the worker's stdout+stderr go (a local path or a backend URL).
    ``node`` is the index of the node it runs on; ``host`` is that node's address.
    """

    group: str
    rank: int
    host: str
    ports: list[int]
    log_path: str
    status: WorkerStatus = WorkerStatus.PENDING
    pid: int | None = None
    job_id: str | None = None
    exit_code: int | None = None
    devices: list[str] = field(default_factory=list)
    node: int = 0

    @property
    def name(self) -> str:
        """``group/rank``, the name used in logs and error messages."""
        return f"{self.group}/{self.rank}"


class Scheduler(ABC):
    """Starts, watches and stops groups of workers. Use as ``with scheduler:`` to stop all on exit.

    Methods that take a group name raise :class:`~areal_tasks.errors.SchedulerError` for an unknown
    group. ``WorkerInfo`` values returned are snapshots; call :meth:`status` again to refresh.
    """

    @abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """The nodes this scheduler places workers on, index 0 first (one for the local scheduler)."""

    @abstractmethod
    def start_group(self, spec: WorkerGroupSpec) -> list[WorkerInfo]:
        """Launch every worker of ``spec`` and return at once (see :meth:`wait_ready`).

        Raises SchedulerError if a group of that name is still running, resources are short, or the
        placement names a node the scheduler does not have.
        """

    @abstractmethod
    def wait_ready(self, group: str, timeout_s: float | None = None) -> None:
        """Block until every worker passes its readiness check (``spec.ready_timeout_s`` by default).

        Raises WorkerFailedError (exit code, log tail) if a worker dies meanwhile, and
        ReadinessTimeoutError if the timeout passes. The group is left as it is either way.
        """

    @abstractmethod
    def status(self, group: str) -> list[WorkerInfo]:
        """Poll every worker; one that exited on its own becomes SUCCEEDED or FAILED (with exit code)."""

    @abstractmethod
    def check(self, group: str) -> None:
        """Raise WorkerFailedError naming every FAILED worker of ``group``; return if none failed."""

    @abstractmethod
    def wait(self, group: str, timeout_s: float | None = None) -> list[WorkerInfo]:
        """Block until every worker has exited (batch jobs) and return their final state.

        Does not raise for failed workers (use :meth:`check`); raises SchedulerError on timeout.
        """

    @abstractmethod
    def stop_group(self, group: str, grace_s: float = 10.0) -> None:
        """Ask every worker to stop, wait ``grace_s``, then force it; returns when all are gone."""

    @abstractmethod
    def stop_all(self, grace_s: float = 10.0) -> None:
        """Stop every group this scheduler started."""

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_all()
