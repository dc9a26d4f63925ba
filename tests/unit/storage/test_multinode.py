"""Multi-node probe with local processes playing the nodes: a shared path passes, a path that is not
shared between the nodes is caught naming the odd node (node 1 against node 0's view when the
coordinator sees no probe; the node the coordinator cannot see otherwise), and a local filesystem warns."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from storage.testing.runner import LocalProcessRunner
from storage.validate import Status, Thresholds, validate_storage
from storage.validate.runner import ProbeRunner

FAST = Thresholds(probe_mb=1, latency_samples=2)


def _visibility(report) -> dict[str, Status]:
    return {r.node.split(" (")[0]: r.status for r in report.results if r.check == "multinode.visibility"}


def test_runner_satisfies_the_protocol() -> None:
    assert isinstance(LocalProcessRunner(), ProbeRunner)


def test_shared_path_passes_and_warns_about_a_local_filesystem(tmp_path: Path) -> None:
    report = validate_storage(tmp_path / "shared", thresholds=FAST, nodes=2, runner=LocalProcessRunner())
    assert report.ok, report.to_json()
    assert report.result("multinode.write").status is Status.PASS
    assert _visibility(report) == {"node 0": Status.PASS, "node 1": Status.PASS}
    # tmp_path lives on a node-local filesystem (ext4/overlay/tmpfs...): a multi-node run gets a warning
    fs = report.result("local.filesystem")
    assert fs.status is Status.WARN and "node-local filesystem" in fs.message and "NFS" in (fs.fix or "")
    assert os.listdir(tmp_path / "shared") == []  # probes removed


def test_private_directory_per_node_is_caught(tmp_path: Path) -> None:
    node_paths = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    report = validate_storage(
        tmp_path / "shared", thresholds=FAST, nodes=2, runner=LocalProcessRunner(), node_urls=node_paths
    )
    assert not report.ok
    # the coordinator's path holds no probe: node 0's view is the reference, node 1 is the odd one
    assert _visibility(report) == {"node 0": Status.PASS, "node 1": Status.FAIL}
    (failure,) = report.failures()
    assert failure.message.startswith("node 1 (")
    assert f"does not share file://{tmp_path}/node1 with node 0 (" in failure.message
    assert failure.path == f"file://{tmp_path}/node1"
    assert "mounted at the same path on every node" in (failure.fix or "")
    assert os.listdir(tmp_path / "node0") == [] and os.listdir(tmp_path / "node1") == []


def _can_unshare_mounts() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs root and unshare -m (mount namespaces)")
def test_same_path_backed_by_different_directories_is_caught(tmp_path: Path) -> None:
    """Each node's process runs in its own mount namespace with its own directory bind-mounted at
    the one "shared" path: the same URL, different storage, like a path on each node's local disk."""
    shared = tmp_path / "shared"
    shared.mkdir()
    private = [tmp_path / "disk0", tmp_path / "disk1"]
    for directory in private:
        directory.mkdir()

    def own_mount(node: int, argv: list[str]) -> list[str]:
        script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        return ["unshare", "-m", "sh", "-c", script, "sh", str(private[node]), str(shared), *argv]

    report = validate_storage(shared, thresholds=FAST, nodes=2, runner=LocalProcessRunner(wrap=own_mount))
    assert _visibility(report) == {"node 0": Status.PASS, "node 1": Status.FAIL}, report.to_json()
    (failure,) = report.failures()
    assert failure.node.startswith("node 1") and f"does not share file://{shared} with node 0" in failure.message
    assert os.listdir(shared) == []  # nothing ever landed on the coordinator's view of the path


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs root and unshare -m (mount namespaces)")
def test_the_node_the_coordinator_cannot_see_is_named_even_when_it_is_node_0(tmp_path: Path) -> None:
    """Node 0 alone has its own directory over the path; node 1 shares it with the coordinator."""
    shared, disk0 = tmp_path / "shared", tmp_path / "disk0"
    shared.mkdir()
    disk0.mkdir()

    def own_mount_on_node0(node: int, argv: list[str]) -> list[str]:
        if node != 0:
            return argv
        script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
        return ["unshare", "-m", "sh", "-c", script, "sh", str(disk0), str(shared), *argv]

    report = validate_storage(shared, thresholds=FAST, nodes=2, runner=LocalProcessRunner(wrap=own_mount_on_node0))
    assert _visibility(report) == {"node 0": Status.FAIL, "node 1": Status.PASS}, report.to_json()
    (failure,) = report.failures()
    assert f"does not share file://{shared} with node 1" in failure.message
    assert "and the coordinator" in failure.message
    assert os.listdir(shared) == [] and os.listdir(disk0) == []


def test_a_node_that_cannot_write_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    node_paths = [str(tmp_path / "ok"), str(tmp_path / "file" / "sub")]
    report = validate_storage(
        tmp_path / "ok", thresholds=FAST, nodes=2, runner=LocalProcessRunner(), node_urls=node_paths
    )
    (failure,) = report.failures()
    assert failure.check == "multinode.write" and failure.node.startswith("node 1")
    assert failure.message.startswith("node 1 (") and "could not write its probe" in failure.message
    assert report.result("multinode.visibility").status is Status.SKIP


def test_a_hanging_node_is_reported_unfinished(tmp_path: Path) -> None:
    def hang_node1_on_write(node: int, argv: list[str]) -> list[str]:
        if node == 1 and "write" in argv:
            return [sys.executable, "-c", "import time; time.sleep(60)"]
        return argv

    runner = LocalProcessRunner(wrap=hang_node1_on_write)
    report = validate_storage(tmp_path, thresholds=FAST, nodes=2, runner=runner, probe_timeout_s=3.0)
    (failure,) = report.failures()
    assert failure.check == "multinode.write" and failure.node == "node 1"
    assert "did not finish within 3 s" in failure.message
    assert os.listdir(tmp_path) == []  # node 0's probe was cleaned up
