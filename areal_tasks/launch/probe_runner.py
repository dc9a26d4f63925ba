"""The storage probe on the job's nodes: a :class:`~storage.validate.ProbeRunner` over any Scheduler.

Each probe round (write, read, clean; see :mod:`storage.validate.multinode`) is one worker group of
``nodes`` workers with ``placement=[0, 1, ..., nodes-1]``: worker ``i`` runs on node ``i`` of
:meth:`Scheduler.nodes`, reserving ``cpus_per_worker=0.1`` (a probe is tiny and must not wait for
cores a job holds). Every :class:`~storage.validate.NodeOutcome` carries the node's name and address
from the scheduler, so reports say ``node 1 (n1, 10.0.0.11)``.

``emulate_nodes=True`` is the one-machine fallback of ``areal storage validate --scheduler local
--nodes N``: the scheduler has a single node, and N processes on it play the nodes (useful to try
per-node paths with ``--node-paths``; it proves nothing about real nodes).

:func:`preflight_storage` is what ``areal train`` runs before a job of several nodes starts: the run
directory and the storage URL must be usable, and shared, from every node.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.scheduler import NodeInfo, Scheduler, WorkerGroupSpec, WorkerInfo
from areal_tasks.errors import ConfigError, SchedulerError

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from storage.validate import NodeOutcome, Thresholds, ValidationReport

logger = logging.getLogger(__name__)

__all__ = ["PROBE_CPUS", "SchedulerProbeRunner", "preflight_storage"]

#: cores each probe worker reserves on a cluster backend.
PROBE_CPUS = 0.1
#: seconds the stopped probe workers get before they are killed.
STOP_GRACE_S = 2.0


class SchedulerProbeRunner:
    """A ProbeRunner over a Scheduler: one worker group per probe round, one worker per node.

    Raises SchedulerError when the scheduler has fewer nodes than the probe asks for (unless
    ``emulate_nodes``, where every worker runs on node 0).
    """

    def __init__(self, scheduler: Scheduler, *, emulate_nodes: bool = False, cpus_per_worker: float = PROBE_CPUS):
        self.scheduler = scheduler
        self.emulate_nodes = emulate_nodes
        self.cpus_per_worker = cpus_per_worker

    def spec(self, command: Sequence[str], nodes: int, env: Mapping[str, str]) -> WorkerGroupSpec:
        """The worker group of one probe round (a fresh name each time)."""
        have = self.scheduler.nodes()
        if not self.emulate_nodes and nodes > len(have):
            listed = ", ".join(node.label for node in have) or "none"
            raise SchedulerError(
                f"the storage probe needs {nodes} nodes, but the scheduler has {len(have)} ({listed}); "
                "ask for no more nodes than the cluster gives (cluster.nodes, --nodes)"
            )
        return WorkerGroupSpec(
            name=f"storage-probe-{uuid.uuid4().hex[:8]}",
            command=list(command),
            env=dict(env),
            replicas=nodes,
            ports_per_worker=0,
            hide_devices=True,
            placement=None if self.emulate_nodes else list(range(nodes)),
            cpus_per_worker=self.cpus_per_worker,
        )

    def run_on_nodes(
        self, command: Sequence[str], nodes: int, env: Mapping[str, str], timeout_s: float
    ) -> list[NodeOutcome]:
        spec = self.spec(command, nodes, env)
        by_index = {node.index: node for node in self.scheduler.nodes()}
        self.scheduler.start_group(spec)
        try:
            infos = self.scheduler.wait(spec.name, timeout_s)
        except SchedulerError as exc:  # some node hung: report it as unfinished rather than abort the report
            logger.warning("%s", exc)
            infos = self.scheduler.status(spec.name)
        finally:
            self.scheduler.stop_group(spec.name, grace_s=STOP_GRACE_S)
        return [self._outcome(info, by_index.get(info.node)) for info in infos]

    def _outcome(self, info: WorkerInfo, node: NodeInfo | None) -> NodeOutcome:
        from storage.validate import NodeOutcome

        finished = info.status.is_terminal and info.exit_code is not None
        log = Path(info.log_path)
        output = log.read_text(errors="replace") if log.is_file() else ""
        host = None
        if not self.emulate_nodes:
            host = f"{node.name}, {node.address}" if node is not None else info.host
        return NodeOutcome(info.rank, info.exit_code if finished else None, output, host)


def preflight_storage(
    cfg: JobConfig,
    scheduler: Scheduler,
    *,
    thresholds: Thresholds | None = None,
    timeout_s: float = 60.0,
) -> list[ValidationReport]:
    """Probe ``experiment.run_dir`` and ``storage.url`` from each of the job's ``cluster.nodes`` nodes
    through ``scheduler``; return the reports, or raise ConfigError listing every failure (each
    naming its node). Does nothing (returns ``[]``) for a job of one node."""
    from storage.validate import Thresholds, validate_storage

    nodes = cfg.cluster.nodes
    if nodes < 2:
        return []
    thresholds = thresholds or Thresholds(probe_mb=1, latency_samples=2)
    runner = SchedulerProbeRunner(scheduler)
    targets: list[tuple[str, str, dict[str, Any]]] = [("experiment.run_dir", str(cfg.experiment.run_dir), {})]
    if cfg.storage.url and cfg.storage.url != targets[0][1]:
        targets.append(("storage.url", cfg.storage.url, dict(cfg.storage.options)))
    reports, problems = [], []
    for what, url, options in targets:
        logger.info("storage preflight: %s (%s) on %d nodes", what, url, nodes)
        report = validate_storage(
            url, options, thresholds=thresholds, nodes=nodes, runner=runner, probe_timeout_s=timeout_s
        )
        reports.append(report)
        problems += [f"{what}: {error}" for error in report.errors()]
    if problems:
        raise ConfigError(
            f"a job of {nodes} nodes needs experiment.run_dir and storage.url usable and shared by every node:\n  "
            + "\n  ".join(problems)
        )
    return reports
