"""``areal storage validate``: JSON report on stdout, exit 0/1/2, the multi-node probe through the
LocalScheduler (local processes play the nodes: the one-machine fallback of ``--scheduler local``);
the probe on real nodes is tested in ``tests/integration/cluster/test_storage_nodes.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from areal_tasks.cli import main
from areal_tasks.launch.registry import SCHEDULERS
from tests.fixtures.two_nodes_scheduler import TwoNodes


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    code = main(["storage", "validate", *args])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else None), out.err


def test_healthy_path_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = _run(capsys, str(tmp_path / "run"), "--probe-mb", "1")
    assert code == 0
    assert report is not None and report["ok"] is True and report["url"] == f"file://{tmp_path}/run"
    assert {c["check"] for c in report["checks"]} >= {"local.path", "local.free_space", "storage.round_trip"}


def test_failed_check_exits_1_and_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, err = _run(capsys, str(tmp_path), "--min-free-gb", "1e9", "--probe-mb", "1")
    assert code == 1
    assert report is not None and report["ok"] is False
    (failed,) = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed["check"] == "local.free_space" and failed["fix"] and failed["node"] and failed["path"]
    assert "FAIL [local.free_space]" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["gs://bucket/x"], "unsupported scheme 'gs'"),
        (["{tmp}", "--nodes", "2", "--node-paths", "{tmp}/a"], "one path per node (2), got 1"),
        (["{tmp}", "--endpoint-url", "http://127.0.0.1:1"], "apply to s3:// URLs only"),
        (["{tmp}", "--nodes", "0"], "--nodes=0 must be >= 1"),
        (["{tmp}", "--min-write-mbps", "-1"], "min_write_mbps=-1.0 must be >= 0"),
        (["s3://bkt/x", "--endpoint-url", "127.0.0.1:9000"], "must start with http"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, report, err = _run(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert code == 2 and report is None
    assert message in err


def test_bad_flag_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["storage", "validate", "/tmp", "--min-free-gb", "lots"])
    assert info.value.code == 2


def test_two_nodes_on_a_shared_path_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = _run(
        capsys, str(tmp_path / "shared"), "--nodes", "2", "--probe-mb", "1", "--run-dir", str(tmp_path / "logs")
    )
    assert code == 0, report
    assert report is not None
    visibility = [c for c in report["checks"] if c["check"] == "multinode.visibility"]
    assert [c["status"] for c in visibility] == ["pass", "pass"]
    assert [c["status"] for c in report["checks"] if c["check"] == "local.filesystem"] == ["warn"]
    assert (tmp_path / "logs" / "logs").is_dir()  # node logs kept under --run-dir


def test_two_nodes_with_private_paths_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "node0", tmp_path / "node1"
    code, report, err = _run(
        capsys, str(tmp_path / "shared"), "--nodes", "2", "--node-paths", str(a), str(b), "--probe-mb", "1"
    )
    assert code == 1
    assert report is not None
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["check"] for c in failed] == ["multinode.visibility"]  # only the odd node, not both
    assert failed[0]["node"].startswith("node 1") and f"does not share file://{b} with node 0" in failed[0]["message"]
    assert "[multinode.visibility] on node 1" in err


def test_scheduler_and_nodes_default_to_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(f"experiment:\n  run_dir: {tmp_path / 'run'}\ncluster:\n  scheduler: local\n  nodes: 1\n")
    code, report, _ = _run(capsys, str(tmp_path / "data"), "--config", str(config), "--probe-mb", "1")
    assert code == 0 and report is not None and report["nodes"] == 1
    code, report, err = _run(capsys, str(tmp_path / "data"), "--config", str(tmp_path / "missing.yaml"))
    assert code == 2 and report is None and "missing.yaml" in err


def test_an_unbuilt_scheduler_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["storage", "validate", str(tmp_path), "--nodes", "2", "--scheduler", "nope"])
    assert info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


@pytest.fixture
def two_nodes_kind() -> Iterator[str]:
    """``twonodes`` registered as a scheduler kind for the test."""
    SCHEDULERS.register("twonodes", TwoNodes)
    try:
        yield "twonodes"
    finally:
        SCHEDULERS.unregister("twonodes")


def test_a_registered_kind_probes_one_worker_per_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], two_nodes_kind: str
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("cluster:\n  scheduler: local\n")
    args = ["--config", str(config), "--scheduler", two_nodes_kind, "--run-dir", str(tmp_path / "run"), "--probe-mb"]
    code, report, err = _run(capsys, str(tmp_path / "shared"), *args, "1", "--nodes", "2")
    assert code == 0, err
    assert report is not None and report["nodes"] == 2
    visibility = [(c["node"], c["status"]) for c in report["checks"] if c["check"] == "multinode.visibility"]
    assert visibility == [("node 0 (n0, 127.0.0.1)", "pass"), ("node 1 (n1, 127.0.0.2)", "pass")]
    assert any(p.name.startswith("storage-probe-") for p in (tmp_path / "run" / "logs").iterdir())

    code, report, err = _run(capsys, str(tmp_path / "shared"), *args, "1", "--nodes", "3")
    assert code == 1 and report is None
    assert "the storage probe needs 3 nodes, but the scheduler has 2 (node 0 (n0, 127.0.0.1)" in err


def test_a_kind_whose_controller_runs_elsewhere_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], two_nodes_kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TwoNodes, "here", False)
    code, report, err = _run(capsys, str(tmp_path), "--scheduler", two_nodes_kind, "--nodes", "2")
    assert code == 2 and report is None
    assert "cannot start the probe from this machine: run this command on a node of the cluster" in err
