"""Storage on a real S3-compatible server (SeaweedFS): round trips, multipart, commits, copies, and
clear errors for wrong credentials, a missing bucket, a read-only identity and an unreachable endpoint."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from storage import (
    Storage,
    StorageConnectionError,
    StorageNotFoundError,
    StoragePermissionError,
    atomic,
    copy_tree,
    read_commit,
)
from storage.testing.seaweed import SeaweedS3Server

pytestmark = pytest.mark.integration


def test_round_trip_list_delete(s3_storage: Storage) -> None:
    s3_storage.write_bytes("a/b.bin", b"\x00payload")
    s3_storage.write_text("a/c.txt", "text")
    s3_storage.write_text("d.txt", "d")
    assert s3_storage.read_bytes("a/b.bin") == b"\x00payload"
    assert s3_storage.read_text("a/c.txt") == "text"
    assert s3_storage.list() == ["a", "d.txt"]
    assert s3_storage.walk_files("a") == {"b.bin": 8, "c.txt": 4}
    assert s3_storage.exists("a") and s3_storage.is_dir("a") and not s3_storage.exists("zzz")
    s3_storage.delete("a", recursive=True)
    assert s3_storage.walk_files() == {"d.txt": 1}
    # SeaweedFS keeps an emptied directory as a `prefix/` marker: delete removes it too
    assert not s3_storage.exists("a") and not s3_storage.is_dir("a") and s3_storage.list() == ["d.txt"]
    with pytest.raises(StorageNotFoundError):
        s3_storage.delete("a/b.bin")
    with pytest.raises(StorageNotFoundError, match="not found"):
        s3_storage.read_bytes("a/b.bin")


def test_deleted_nested_prefix_no_longer_exists(s3_storage: Storage) -> None:
    s3_storage.write_text("ckpt/step_1/model/shard.bin", "x")
    s3_storage.write_text("ckpt/step_1/meta.json", "{}")
    s3_storage.write_text("ckpt/step_2/meta.json", "{}")
    s3_storage.delete("ckpt/step_1", recursive=True)
    for gone in ("ckpt/step_1", "ckpt/step_1/model"):
        assert not s3_storage.exists(gone) and not s3_storage.is_dir(gone)
    assert s3_storage.list("ckpt") == ["step_2"] and s3_storage.walk_files() == {"ckpt/step_2/meta.json": 2}
    s3_storage.delete("ckpt/step_1", recursive=True, missing_ok=True)  # already gone: no error
    with pytest.raises(StorageNotFoundError):
        s3_storage.delete("ckpt/step_1", recursive=True)


def test_listing_sees_writes_of_another_client(s3_server: SeaweedS3Server, s3_storage: Storage) -> None:
    assert s3_storage.list_committed("ckpt") == []
    other = Storage.from_url(str(s3_storage.url), s3_server.storage_options())
    other.write_text("ckpt/step_1/x", "1")
    other.commit_directory("ckpt/step_1")
    assert s3_storage.list_committed("ckpt") == ["step_1"]  # no stale listing cache


def test_large_atomic_write_goes_multipart(
    s3_server: SeaweedS3Server, s3_storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(atomic, "UPLOAD_PART_BYTES", 5 * 2**20)  # the S3 minimum, to keep the test small
    data = os.urandom(12 * 2**20 + 123)
    with s3_storage.atomic_write("big/blob.bin") as handle:
        handle.write(data[: 2**20])
        assert not s3_storage.exists("big/blob.bin")  # nothing published before the block ends
        handle.write(data[2**20 :])
    assert s3_storage.read_bytes("big/blob.bin") == data
    bucket, key = s3_storage.url.bucket, f"{s3_storage.url.key_prefix}/big/blob.bin"
    etag = s3_server.client().head_object(Bucket=bucket, Key=key)["ETag"]
    assert etag.strip('"').endswith("-3")  # a multipart object's ETag is <md5>-<number of parts>


def test_failed_atomic_write_publishes_nothing(s3_storage: Storage) -> None:
    with pytest.raises(RuntimeError), s3_storage.atomic_write("x.bin") as handle:
        handle.write(b"partial")
        raise RuntimeError("crash")
    assert not s3_storage.exists("x.bin")


def test_commit_semantics_on_s3(s3_storage: Storage) -> None:
    with s3_storage.staged_directory("ckpt/step_5", metadata={"step": 5}) as d:
        d.write_bytes("model/shard0.bin", b"w" * 100)
        assert s3_storage.list_committed("ckpt") == []  # written in place, not yet committed
    assert s3_storage.list_committed("ckpt") == ["step_5"]
    assert read_commit(s3_storage, "ckpt/step_5")["files"] == {"model/shard0.bin": 100}
    with pytest.raises(RuntimeError), s3_storage.staged_directory("ckpt/step_6") as d:
        d.write_bytes("model/shard0.bin", b"partial")
        raise RuntimeError("crash")
    assert s3_storage.list_committed("ckpt") == ["step_5"]
    assert s3_storage.walk_files("ckpt/step_6") == {}  # the partial files are gone


def test_copy_local_to_s3_and_back(tmp_path: Path, s3_storage: Storage) -> None:
    local = Storage.from_url(tmp_path / "ckpt")
    local.write_bytes("model/shard0.bin", os.urandom(300_000))
    local.write_text("meta.json", "{}")
    bar = io.StringIO()
    stats = copy_tree(local, "", s3_storage, "upload/step_1", progress=True, progress_file=bar, commit=True)
    assert stats.files == 2 and "100%" in bar.getvalue()
    assert s3_storage.list_committed("upload") == ["step_1"]
    back = Storage.from_url(tmp_path / "back")
    copy_tree(s3_storage, "upload/step_1", back, "", progress=False)
    assert back.read_bytes("model/shard0.bin") == local.read_bytes("model/shard0.bin")


def test_wrong_secret_is_a_clear_permission_error(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    options = {**s3_server.storage_options(), "secret": "not-the-secret"}
    storage = Storage.from_url(f"s3://{s3_bucket}/p", options)
    with pytest.raises(StoragePermissionError, match="SignatureDoesNotMatch.*secret key does not match"):
        storage.write_text("x", "1")


def test_unknown_access_key_is_a_clear_permission_error(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    options = {**s3_server.storage_options(), "key": "AKUNKNOWN0000000", "secret": "x"}
    with pytest.raises(StoragePermissionError, match="InvalidAccessKeyId.*access key is unknown"):
        Storage.from_url(f"s3://{s3_bucket}/p", options).list()


def test_missing_bucket_is_a_clear_not_found(s3_server: SeaweedS3Server) -> None:
    storage = Storage.from_url("s3://no-such-bucket-here/p", s3_server.storage_options())
    with pytest.raises(StorageNotFoundError, match="bucket does not exist.*create it or fix the URL"):
        storage.write_text("x", "1")


def test_read_only_identity_reads_but_cannot_write(s3_server: SeaweedS3Server, s3_storage: Storage) -> None:
    s3_storage.write_text("shared.txt", "hello")
    reader = Storage.from_url(str(s3_storage.url), s3_server.storage_options(s3_server.readonly))
    assert reader.read_text("shared.txt") == "hello"
    with pytest.raises(StoragePermissionError, match="AccessDenied"):
        reader.write_text("shared.txt", "overwrite")
    assert s3_storage.read_text("shared.txt") == "hello"


def test_credentials_from_the_environment(s3_server: SeaweedS3Server, s3_bucket: str) -> None:
    storage = Storage.from_url(f"s3://{s3_bucket}/env", env=s3_server.env())
    storage.write_text("f", "from env")
    assert storage.read_text("f") == "from env"
    assert storage.describe()["endpoint_source"] == "env AWS_ENDPOINT_URL_S3"


def test_unreachable_endpoint_fails_fast(closed_port: int) -> None:
    options = {"endpoint_url": f"http://127.0.0.1:{closed_port}", "key": "k", "secret": "s"}
    with pytest.raises(StorageConnectionError, match="cannot connect"):
        Storage.from_url("s3://bucket-x/p", options).read_bytes("f")
