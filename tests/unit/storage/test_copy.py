"""copy_tree between storages: contents, progress bar, commit, and a transient failure retried."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest

from storage import RetryPolicy, Storage, StorageNotFoundError, copy_tree


def _source(tmp_path: Path) -> Storage:
    src = Storage.from_url(tmp_path / "src")
    src.write_bytes("ckpt/model/shard0.bin", b"a" * 3000)
    src.write_bytes("ckpt/model/shard1.bin", b"b" * 2000)
    src.write_text("ckpt/meta.json", '{"step": 3}')
    return src


def test_copy_file_to_memory_with_progress(tmp_path: Path) -> None:
    src = _source(tmp_path)
    dst = Storage.from_url(f"memory://copy-{uuid.uuid4().hex}")
    bar = io.StringIO()
    stats = copy_tree(src, "ckpt", dst, "upload/step_3", progress=True, progress_file=bar)
    assert (stats.files, stats.bytes) == (3, 5011)
    assert dst.walk_files("upload/step_3") == {"meta.json": 11, "model/shard0.bin": 3000, "model/shard1.bin": 2000}
    assert dst.read_bytes("upload/step_3/model/shard1.bin") == b"b" * 2000
    output = bar.getvalue()
    assert "100%" in output and "copy -> memory://" in output
    assert "4.89k/4.89k" in output  # 5011 bytes in KiB: the bar counts bytes, not files


def test_copy_without_progress_prints_nothing(tmp_path: Path) -> None:
    bar = io.StringIO()
    copy_tree(_source(tmp_path), "ckpt", Storage.from_url(tmp_path / "dst"), "", progress=False, progress_file=bar)
    assert bar.getvalue() == ""
    assert (tmp_path / "dst/model/shard0.bin").read_bytes() == b"a" * 3000


def test_copy_commits_destination_and_skips_source_marker(tmp_path: Path) -> None:
    src = _source(tmp_path)
    src.commit_directory("ckpt")
    dst = Storage.from_url(tmp_path / "dst")
    copy_tree(src, "ckpt", dst, "step_3", commit=True, progress=False)
    assert dst.list_committed() == ["step_3"]
    assert dst.read_text("step_3/_COMMITTED") != src.read_text("ckpt/_COMMITTED")  # a fresh marker
    assert set(dst.walk_files("step_3")) == {"_COMMITTED", "meta.json", "model/shard0.bin", "model/shard1.bin"}


def test_copy_retries_a_transient_upload_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _source(tmp_path)
    dst = Storage.from_url(
        f"memory://flaky-{uuid.uuid4().hex}", retry=RetryPolicy(attempts=3, initial_delay_s=0.001, jitter=0)
    )
    real_put = dst.fs.put_file
    failures = []

    def flaky_put(lpath: str, rpath: str, **kwargs: object) -> None:
        if rpath.endswith("shard0.bin") and not failures:
            failures.append(rpath)
            raise ConnectionResetError("connection reset by peer")
        real_put(lpath, rpath, **kwargs)

    monkeypatch.setattr(dst.fs, "put_file", flaky_put)
    stats = copy_tree(src, "ckpt", dst, "out", progress=False)
    assert len(failures) == 1
    assert stats.files == 3
    assert dst.read_bytes("out/model/shard0.bin") == b"a" * 3000


def test_copy_of_a_missing_source_fails(tmp_path: Path) -> None:
    with pytest.raises(StorageNotFoundError, match="does not exist"):
        copy_tree(Storage.from_url(tmp_path), "nope", Storage.from_url(tmp_path / "d"), "", progress=False)
