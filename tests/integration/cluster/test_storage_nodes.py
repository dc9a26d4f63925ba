"""The storage probe on real nodes (issue #27 item 6): one probe worker per node through a Scheduler.

On the two namespace nodes of ``netns_cluster``: a shared path passes; a path each node sees as its
own directory (``netns_cluster.private``) fails naming node 1, and only node 1, as the node that does
not share it with node 0; an S3 endpoint that node 1 cannot reach (``block()``: EACCES at connect)
fails node 1's write, named. ``preflight_storage`` (what ``areal train`` runs for ``cluster.nodes >
1``) raises naming the node for a run directory that is not shared.

Every test takes ``probe_scheduler``, parametrized over :data:`PROBE_SCHEDULERS`: today only the
test-only :class:`~tests.fixtures.netns_scheduler.NetnsScheduler`. When the Ray or SLURM backend has
a fixture that gives a Scheduler over the namespace cluster, add its kind and fixture name there and
these same tests run through it (a kind whose fixture is not defined is skipped, naming it).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_tasks.api.scheduler import Scheduler
from areal_tasks.config import load_config
from areal_tasks.errors import ConfigError
from areal_tasks.launch.probe_runner import SchedulerProbeRunner, preflight_storage
from storage.validate import Status, Thresholds, ValidationReport, validate_storage
from tests.fixtures.netns import NamespaceCluster
from tests.fixtures.netns_scheduler import NetnsScheduler

pytestmark = [pytest.mark.cluster, pytest.mark.integration, pytest.mark.timeout(120)]

#: scheduler kind -> the fixture that gives a Scheduler whose nodes are ``netns_cluster``'s nodes.
#: Add e.g. ``"ray": "ray_probe_scheduler"`` and ``"slurm": "slurm_probe_scheduler"`` once they exist.
PROBE_SCHEDULERS: dict[str, str] = {"netns": "netns_probe_scheduler"}

FAST = Thresholds(probe_mb=1, latency_samples=2, min_free_gb=None)
TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def netns_probe_scheduler(
    netns_cluster: NamespaceCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scheduler]:
    with NetnsScheduler(netns_cluster, tmp_path_factory.mktemp("probe-scheduler")) as scheduler:
        yield scheduler


@pytest.fixture(params=sorted(PROBE_SCHEDULERS))
def probe_scheduler(request: pytest.FixtureRequest) -> Scheduler:
    """The Scheduler of one kind over the namespace nodes (see :data:`PROBE_SCHEDULERS`)."""
    name = PROBE_SCHEDULERS[request.param]
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.skip(f"no fixture {name!r} for the {request.param} scheduler yet")


def _probe(scheduler: Scheduler, url: str, options: dict[str, str] | None = None) -> ValidationReport:
    runner = SchedulerProbeRunner(scheduler)
    return validate_storage(url, options, thresholds=FAST, nodes=2, runner=runner, probe_timeout_s=TIMEOUT_S)


def _labels(cluster: NamespaceCluster) -> list[str]:
    return [f"node {n.index} ({n.name}, {n.address})" for n in cluster.nodes]


def _results(report: ValidationReport, check: str) -> list[tuple[str, Status]]:
    return [(r.node, r.status) for r in report.results if r.check == check]


def test_a_shared_path_passes_on_two_nodes(netns_cluster: NamespaceCluster, probe_scheduler: Scheduler) -> None:
    path = netns_cluster.shared / f"probe-{uuid.uuid4().hex[:8]}"
    report = _probe(probe_scheduler, str(path))
    assert report.ok, report.to_json()
    node0, node1 = _labels(netns_cluster)
    assert _results(report, "multinode.visibility") == [(node0, Status.PASS), (node1, Status.PASS)]
    assert list(path.iterdir()) == []  # the coordinator removed every probe


def test_a_private_path_names_node_1_only(netns_cluster: NamespaceCluster, probe_scheduler: Scheduler) -> None:
    name = f"probe-{uuid.uuid4().hex[:8]}"
    path = netns_cluster.private / name
    report = _probe(probe_scheduler, str(path))
    node0, node1 = _labels(netns_cluster)
    assert _results(report, "multinode.write") == [("all 2 nodes", Status.PASS)]
    # node 0 is the reference (the coordinator, on the host, sees neither node's copy): not both fail
    assert _results(report, "multinode.visibility") == [(node0, Status.PASS), (node1, Status.FAIL)], report.to_json()
    (failure,) = report.failures()
    assert failure.message == f"{node1} does not share file://{path} with {node0}"
    assert "mounted at the same path on every node" in (failure.fix or "")
    for node in netns_cluster.nodes:  # each node removed the probe it wrote on its own copy of the path
        assert list((node.root / "private" / name).iterdir()) == []


@pytest.fixture(scope="module")
def bridge_s3(netns_cluster: NamespaceCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    """A SeaweedFS bound to the bridge address (the session one listens on the host's loopback, which
    the nodes cannot reach): ``(s3 URL of a fresh bucket, storage options)``; stopped by PID."""
    from tests.fixtures.s3_server import start_s3_server

    assert netns_cluster.host_address is not None
    with start_s3_server(tmp_path_factory.mktemp("bridge-s3"), host=netns_cluster.host_address) as server:
        bucket = server.create_bucket(f"t-{uuid.uuid4().hex[:12]}")
        yield f"s3://{bucket}/runs", server.storage_options()


def test_an_s3_endpoint_one_node_cannot_reach_names_it(
    netns_cluster: NamespaceCluster, probe_scheduler: Scheduler, bridge_s3: tuple[str, dict]
) -> None:
    url, options = bridge_s3
    node1 = _labels(netns_cluster)[1]
    netns_cluster.nodes[1].block(netns_cluster.host_address or "")
    try:
        report = _probe(probe_scheduler, url, options)
    finally:
        netns_cluster.nodes[1].unblock(netns_cluster.host_address or "")
    assert report.result("s3.bucket").status is Status.PASS  # the coordinator reaches it
    (failure,) = report.failures()
    assert failure.check == "multinode.write" and failure.node == node1, report.to_json()
    assert failure.message.startswith(f"{node1} could not write its probe: StorageConnectionError")
    assert "cannot connect to the storage endpoint" in failure.message
    assert "endpoint reachable from the node" in (failure.fix or "")
    print("MSG", failure.message)
    assert report.result("multinode.visibility").status is Status.SKIP


def test_preflight_names_the_node_of_a_run_dir_that_is_not_shared(
    netns_cluster: NamespaceCluster, probe_scheduler: Scheduler
) -> None:
    base = load_config(None, [f"experiment.run_dir={netns_cluster.shared / 'run'}"])
    shared = dataclasses.replace(base, cluster=dataclasses.replace(base.cluster, nodes=2))
    reports = preflight_storage(shared, probe_scheduler, thresholds=FAST)
    assert [r.ok for r in reports] == [True, True]  # experiment.run_dir and storage.url (under it)

    private_dir = netns_cluster.private / f"run-{uuid.uuid4().hex[:8]}"
    experiment = dataclasses.replace(shared.experiment, run_dir=str(private_dir))
    private = dataclasses.replace(shared, experiment=experiment)
    with pytest.raises(ConfigError) as info:
        preflight_storage(private, probe_scheduler, thresholds=FAST)
    node0, node1 = _labels(netns_cluster)
    message = str(info.value)
    assert f"experiment.run_dir: [multinode.visibility] on {node1}" in message
    assert f"does not share file://{private_dir} with {node0}" in message
    assert f"on {node0}" not in message
    assert not Path(private_dir / ".areal-probe").exists()
