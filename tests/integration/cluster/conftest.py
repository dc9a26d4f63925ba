"""Fixtures of the namespace-cluster tests: ``netns_cluster``, two namespace nodes for the package, and
``ray_cluster``, a 2-node Ray cluster in them (tests/fixtures/ray_cluster.py), and ``slurm_cluster``, a
real SLURM on two namespace nodes of its own (tests/fixtures/slurm_cluster.py).

The tests need root (network namespaces, a bridge, mounts); without it, or where namespaces are
refused (a container without CAP_SYS_ADMIN), they skip with the reason
:meth:`~tests.fixtures.netns.NamespaceCluster.unavailable_reason` gives. Nothing here changes the
suite's ordering (``tests/conftest.py``): the cluster is cheap and stopped at the end of the package.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.netns import NamespaceCluster
from tests.fixtures.ray_cluster import RayCluster
from tests.fixtures.slurm_cluster import SlurmCluster


@pytest.fixture(scope="package")
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """Two nodes on a private bridge, the host as login node (10.231.K.1); stopped (and checked) at the end."""
    reason = NamespaceCluster.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = NamespaceCluster(n_nodes=2, host_address=True, base=tmp_path_factory.mktemp("netns"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="package")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A SLURM cluster (munged on the host, slurmctld in node 0, a slurmd per node) on two namespace nodes
    of its own, so that killing one of its nodes touches no other backend's daemons; stopped at the end."""
    reason = NamespaceCluster.unavailable_reason() or SlurmCluster.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    nodes = NamespaceCluster(n_nodes=2, host_address=True, base=tmp_path_factory.mktemp("slurm-netns"))
    nodes.start()
    try:
        cluster = SlurmCluster(nodes, tmp_path_factory.mktemp("slurm"))
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        nodes.stop()


@pytest.fixture
def ray_cluster(ray_cluster_package: RayCluster) -> RayCluster:
    """The package's Ray cluster, with both nodes up (a test that killed node 1 may have left it down)."""
    ray_cluster_package.ensure_healthy()
    return ray_cluster_package


@pytest.fixture(scope="package")
def ray_cluster_package(
    netns_cluster: NamespaceCluster, tmp_path_factory: pytest.TempPathFactory, repo_root: Path
) -> Iterator[RayCluster]:
    """A 2-node Ray cluster (head on node 0, worker on node 1) for the package; skips without ray."""
    reason = RayCluster.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = RayCluster(netns_cluster, repo_root, tmp_path_factory.mktemp("ray-logs"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Within this package, the tests that kill a node run last (those that run a whole job or DAG
    last of all), so that every other test finds both nodes of its cluster as they started."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(str(item.path)).parents]

    def rank(item: pytest.Item) -> int:
        return 0 if "kills_nodes" not in item.keywords else (2 if "airflow" in item.keywords else 1)

    ordered = sorted((items[i] for i in slots), key=rank)
    for slot, item in zip(slots, ordered):
        items[slot] = item
