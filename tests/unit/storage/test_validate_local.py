"""Validation of local paths: each planted misconfiguration is caught with a clear, typed message."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from storage import StorageConfigError, StorageValidationError
from storage.validate import Status, Thresholds, validate_storage
from storage.validate.fstype import classify_fs_type, filesystem_of, parse_mounts

FAST = Thresholds(probe_mb=1, latency_samples=2)

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
server:/export /mnt/shared nfs4 rw,vers=4.2 0 0
tmpfs /mnt/shared/scratch tmpfs rw 0 0
//nas/share /mnt/my\\040share cifs rw 0 0
lustre@o2ib:/fs /lustre lustre rw 0 0
host0 /mnt/host 9p rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "fs_type", "sharing"),
    [
        ("/home/user/run", "ext4", "local"),
        ("/mnt/shared/run", "nfs4", "shared"),
        ("/mnt/shared/scratch/x", "tmpfs", "local"),  # the longest mount point wins
        ("/mnt/shared2/x", "ext4", "local"),  # a prefix of the name is not a parent directory
        ("/mnt/my share/ckpt", "cifs", "shared"),  # octal escapes in the mount table
        ("/lustre/proj", "lustre", "shared"),
        ("/mnt/host/data", "9p", "unknown"),
    ],
)
def test_filesystem_of_fake_mount_table(path: str, fs_type: str, sharing: str) -> None:
    info = filesystem_of(path, MOUNTS, resolve=False)
    assert (info.fs_type, info.sharing) == (fs_type, sharing)


def test_classify_and_parse() -> None:
    assert [classify_fs_type(t) for t in ("xfs", "overlay", "NFS", "gpfs", "fuse.sshfs")] == [
        "local",
        "local",
        "shared",
        "shared",
        "unknown",
    ]
    assert parse_mounts(MOUNTS)[3] == ("//nas/share", "/mnt/my share", "cifs")


def test_filesystem_of_this_machine(tmp_path: Path) -> None:
    info = filesystem_of(str(tmp_path / "not" / "yet"))  # a missing path resolves to its existing parent
    assert info.fs_type != "unknown" and tmp_path.as_posix().startswith(info.mount_point)


def test_healthy_local_path_passes(tmp_path: Path) -> None:
    report = validate_storage(tmp_path / "run", thresholds=FAST)
    assert report.ok, report.to_json()
    checks = [r.check for r in report.results]
    assert checks == ["local.path", "local.filesystem", "local.free_space", "storage.round_trip", "storage.throughput"]
    assert report.result("local.path").details == {"created": True}
    assert report.result("storage.throughput").details["write_mbps"] > 0
    assert os.listdir(tmp_path / "run") == []  # probes cleaned up
    parsed = json.loads(report.to_json())
    assert parsed["ok"] is True and parsed["summary"]["pass"] == 5


def test_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    report = validate_storage(tmp_path / "afile" / "run", thresholds=FAST)
    assert not report.ok
    failure = report.result("local.path")
    assert failure.status is Status.FAIL
    assert "cannot create" in failure.message and "Not a directory" in failure.message
    assert "is a file" in (failure.fix or "")
    assert [r.status for r in report.results[1:]] == [Status.SKIP, Status.SKIP]
    error = failure.error()
    assert isinstance(error, StorageValidationError)
    assert (error.check, error.path) == ("local.path", f"file://{tmp_path}/afile/run")
    assert error.node and error.fix and "Fix:" in str(error)


def test_path_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    report = validate_storage(tmp_path / "f", thresholds=FAST)
    assert "exists but is not a directory" in report.result("local.path").message


def test_free_space_threshold_too_high(tmp_path: Path) -> None:
    report = validate_storage(tmp_path, thresholds=Thresholds(min_free_gb=1e9, probe_mb=1, latency_samples=2))
    failure = report.result("local.free_space")
    assert failure.status is Status.FAIL
    assert "GB free, 1e+09 GB required" in failure.message and "--min-free-gb" in (failure.fix or "")
    assert [f.check for f in report.failures()] == ["local.free_space"]
    with pytest.raises(StorageValidationError, match=r"\[local.free_space\]"):
        report.raise_on_failure()


def test_throughput_and_latency_thresholds(tmp_path: Path) -> None:
    impossible = Thresholds(min_write_mbps=1e9, min_read_mbps=1e9, max_latency_ms=1e-9, probe_mb=1, latency_samples=2)
    failure = validate_storage(tmp_path, thresholds=impossible).result("storage.throughput")
    assert failure.status is Status.FAIL
    for part in ("write", "read", "median latency"):
        assert part in failure.message
    assert failure.details["write_mbps"] > 0


def _read_only_command(directory: Path) -> list[str] | None:
    """A command running the validator where ``directory`` is read-only (root ignores chmod)."""
    validate = [sys.executable, "-m", "areal_tasks.cli", "storage", "validate", str(directory), "--probe-mb", "1"]
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return validate
    if shutil.which("unshare") is None:
        return None
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    return ["unshare", "-m", "sh", "-c", script, "sh", str(directory), *validate]


def test_read_only_directory(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    command = _read_only_command(directory)
    if command is None:
        pytest.skip("running as root without unshare: cannot make a read-only directory")
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    directory.chmod(0o755)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["check"] for c in failed] == ["storage.round_trip"]
    assert "cannot write" in failed[0]["message"] and "read-write" in failed[0]["fix"]


def test_memory_backend_runs_common_checks_only() -> None:
    report = validate_storage("memory://validate-unit", thresholds=FAST)
    assert report.ok and [r.check for r in report.results] == ["storage.round_trip", "storage.throughput"]


def test_usage_errors_raise_config_errors(tmp_path: Path) -> None:
    with pytest.raises(StorageConfigError, match="needs a ProbeRunner"):
        validate_storage(tmp_path, nodes=2)
    with pytest.raises(StorageConfigError, match="one per node"):
        validate_storage(tmp_path, nodes=2, runner=object(), node_urls=[str(tmp_path)])  # type: ignore[arg-type]
    with pytest.raises(StorageConfigError, match="unsupported scheme"):
        validate_storage("gs://bucket/x")
