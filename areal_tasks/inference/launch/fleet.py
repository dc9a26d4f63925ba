"""``ServerFleet``: N inference servers started, watched, restarted and stopped through the Scheduler.

Each server is its own worker group (``<name>-<i>``), so one crashed server is restarted alone.
:meth:`ServerFleet.start` launches all of them and waits for their health endpoint;
:meth:`ServerFleet.check` (call it periodically, e.g. once per RL step) notices servers that exited
or stopped answering health probes and restarts each at most ``max_restarts`` times over the
fleet's life, then fails with :class:`~areal_tasks.errors.InferenceServerFailedError` carrying the
crash report (exit code and log tail). A restarted server gets a new port: pass
:attr:`ServerFleet.addresses` to the client (``engine.set_servers``) when ``check`` restarted any.
"""

from __future__ import annotations

import logging
import os
from types import TracebackType
from typing import TYPE_CHECKING

from areal_tasks.api.run_dir import ensure_server_admin_key
from areal_tasks.api.scheduler import ReadinessCheck, Scheduler, WorkerGroupSpec, WorkerStatus
from areal_tasks.errors import InferenceServerFailedError, SchedulerError, WorkerFailedError
from areal_tasks.inference.launch.commands import ServerCommand, build_server_command, server_layout
from areal_tasks.launch.readiness import probe

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["ServerFleet"]


class ServerFleet:
    """Runs ``n_servers`` copies of ``command`` through ``scheduler``.

    Args:
        devices_per_server: accelerators per server (0 on CPU).
        hide_devices: with 0 devices, hide the host's accelerators from the servers.
        startup_timeout_s: how long one server may take to answer its health check.
        max_restarts: restarts allowed per server (crashes at start-up count too).
        unhealthy_limit: consecutive failed health probes after which a running server is restarted.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        command: ServerCommand,
        n_servers: int,
        *,
        name: str = "inference",
        devices_per_server: int = 0,
        hide_devices: bool = False,
        startup_timeout_s: float = 600.0,
        max_restarts: int = 2,
        unhealthy_limit: int = 3,
        health_timeout_s: float = 5.0,
        nodes: list[int] | None = None,
    ) -> None:
        if n_servers < 1:
            raise InferenceServerFailedError(f"a server fleet needs n_servers >= 1, got {n_servers}")
        if nodes is not None and len(nodes) != n_servers:
            raise InferenceServerFailedError(f"nodes={nodes} must name one node per server ({n_servers})")
        #: the node index (into ``scheduler.nodes()``) each server runs on; None = all on node 0.
        self.nodes = list(nodes) if nodes is not None else [0] * n_servers
        self.scheduler = scheduler
        self.command = command
        self.n_servers = n_servers
        self.name = name
        self.max_restarts = max_restarts
        self.unhealthy_limit = unhealthy_limit
        self.health_timeout_s = health_timeout_s
        self._spec_kwargs = {
            "devices_per_worker": devices_per_server,
            "hide_devices": hide_devices,
            "ready_timeout_s": startup_timeout_s,
        }
        self.restarts = [0] * n_servers
        self._addresses: list[str | None] = [None] * n_servers
        self._pending: dict[int, str] = {}
        self._launched = [False] * n_servers
        self._unhealthy = [0] * n_servers

    @classmethod
    def from_config(
        cls, scheduler: Scheduler, cfg: JobConfig, model_path: str, *, weight_version: int = 0, name: str = "inference"
    ) -> ServerFleet:
        """The fleet of ``cfg``: backend, command line, server count and devices from the config.

        ``model_path`` holds the weights of policy version ``weight_version``. A restarted server
        comes back with these weights: re-apply the latest weight update to it.
        """
        from areal_tasks.launch.placement import plan_placement

        layout = server_layout(cfg)
        on_gpus = cfg.cluster.gpus_per_node > 0
        return cls(
            scheduler,
            build_server_command(cfg, model_path, layout, weight_version),
            layout.n_servers,
            name=name,
            devices_per_server=layout.devices_per_server if on_gpus else 0,
            hide_devices=not on_gpus,
            startup_timeout_s=cfg.rollout.server.startup_timeout_s,
            max_restarts=cfg.rollout.server.max_restarts,
            nodes=list(plan_placement(cfg.allocation, cfg.cluster).servers),
        )

    # -- life cycle ----------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every server, in server order."""
        missing = [i for i, a in enumerate(self._addresses) if a is None]
        if missing:
            raise InferenceServerFailedError(f"servers {missing} of fleet {self.name!r} are not running; start() it")
        return [a for a in self._addresses if a is not None]

    def devices(self) -> list[list[str]]:
        """The device ids each server holds, in server order (empty lists on CPU)."""
        return [list(self.scheduler.status(self.group_name(i))[0].devices) for i in range(self.n_servers)]

    def group_name(self, index: int) -> str:
        """The Scheduler group of server ``index``."""
        return f"{self.name}-{index}"

    def start(self) -> list[str]:
        """Start every server, wait until all are healthy, and return their addresses. The job's
        server key (``AREAL_SERVER_ADMIN_KEY``) is made first when this process has none: the
        servers, and the workers and clients started after them, read it from the environment."""
        ensure_server_admin_key(os.environ)
        for i in range(self.n_servers):
            self._launch(i)
        for i in range(self.n_servers):
            self._await_ready(i)
        logger.info("fleet %s: %d %s servers up at %s", self.name, self.n_servers, self.command.backend, self.addresses)
        return self.addresses

    def check(self) -> list[int]:
        """Restart servers that exited or stopped answering; returns the indices restarted."""
        restarted = []
        for i in range(self.n_servers):
            reason = self._problem(i)
            if reason is not None:
                self._restart(i, reason)
                restarted.append(i)
        return restarted

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop every server (idempotent)."""
        for i in range(self.n_servers):
            if self._launched[i]:
                self.scheduler.stop_group(self.group_name(i), grace_s)
            self._launched[i] = False
            self._addresses[i] = None
        logger.info("fleet %s stopped", self.name)

    def __enter__(self) -> ServerFleet:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals -----------------------------------------------------------------------------

    def _spec(self, index: int) -> WorkerGroupSpec:
        health = "http://{host}:{port}" + self.command.health_path
        return WorkerGroupSpec(
            name=self.group_name(index),
            command=list(self.command.argv),
            env=_with_trace_role(self.command.env, index),
            replicas=1,
            ports_per_worker=1,
            readiness=ReadinessCheck.http(health),
            placement=[self.nodes[index]],
            **self._spec_kwargs,
        )

    def _launch(self, index: int) -> None:
        (info,) = self.scheduler.start_group(self._spec(index))
        self._launched[index] = True
        self._addresses[index] = None
        self._pending[index] = f"{info.host}:{info.ports[0]}"

    def _await_ready(self, index: int) -> None:
        """Wait for server ``index``; a crash while starting is restarted within the budget."""
        while True:
            try:
                self.scheduler.wait_ready(self.group_name(index))
            except WorkerFailedError as exc:
                self._count_restart(index, f"crashed while starting:\n{exc}")
                self.scheduler.stop_group(self.group_name(index))
                self._launch(index)
                continue
            except SchedulerError as exc:  # readiness timeout: a hung start is not retried
                self.scheduler.stop_group(self.group_name(index))
                raise InferenceServerFailedError(
                    f"server {index} of fleet {self.name!r} never became healthy: {exc}"
                ) from exc
            self._addresses[index] = self._pending.pop(index)
            self._unhealthy[index] = 0
            return

    def _problem(self, index: int) -> str | None:
        """Why server ``index`` needs a restart, or None if it is fine."""
        (info,) = self.scheduler.status(self.group_name(index))
        if info.status.is_terminal and info.status is not WorkerStatus.STOPPED:
            try:
                self.scheduler.check(self.group_name(index))
            except WorkerFailedError as exc:
                return f"crashed:\n{exc}"
            return f"exited with code {info.exit_code} (a server must not exit on its own)"
        address = self._addresses[index]
        if address is None:
            return None
        result = probe("http", f"http://{address}{self.command.health_path}", timeout_s=self.health_timeout_s)
        if result.ready:
            self._unhealthy[index] = 0
            return None
        self._unhealthy[index] += 1
        logger.warning(
            "server %s health probe failed (%d/%d): %s",
            address,
            self._unhealthy[index],
            self.unhealthy_limit,
            result.detail,
        )
        if self._unhealthy[index] >= self.unhealthy_limit:
            return f"failed {self._unhealthy[index]} health probes in a row (last: {result.detail})"
        return None

    def _count_restart(self, index: int, reason: str) -> None:
        if self.restarts[index] >= self.max_restarts:
            raise InferenceServerFailedError(
                f"server {index} of fleet {self.name!r} ({self.command.backend}) {reason}\n"
                f"it was restarted {self.restarts[index]} times already (max_restarts={self.max_restarts}); giving up"
            )
        self.restarts[index] += 1
        logger.error(
            "server %d of fleet %s %s\nrestarting it (%d/%d)",
            index,
            self.name,
            reason,
            self.restarts[index],
            self.max_restarts,
        )

    def _restart(self, index: int, reason: str) -> None:
        self._count_restart(index, reason)
        self.scheduler.stop_group(self.group_name(index))
        self._launch(index)
        self._await_ready(index)
        logger.info("server %d of fleet %s is back at %s", index, self.name, self._addresses[index])


def _with_trace_role(env: dict[str, str], index: int) -> dict[str, str]:
    """The server's environment; with tracing on (``$AREAL_TRACE_DIR`` there) it is named ``server <index>``."""
    from areal_tasks.trace.env import TRACE_DIR_ENV, TRACE_ROLE_ENV

    if TRACE_DIR_ENV not in env:
        return dict(env)
    return {**env, TRACE_ROLE_ENV: f"server {index}"}
