"""Storage round trips on file:// (and plain paths) and memory://: read, write, list, delete, exists, errors."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from storage import Storage, StorageNotFoundError, open_storage
from storage.errors import StorageIOError


@pytest.fixture(params=["file", "path", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "file":
        return Storage.from_url(f"file://{tmp_path}/root")
    if request.param == "path":
        return open_storage(tmp_path / "root")
    return Storage.from_url(f"memory://unit-{uuid.uuid4().hex}/root")


def test_bytes_and_text_round_trip(storage: Storage) -> None:
    storage.write_bytes("a/b/c.bin", b"\x00\x01binary")
    storage.write_text("a/t.txt", "héllo")
    assert storage.read_bytes("a/b/c.bin") == b"\x00\x01binary"
    assert storage.read_text("a/t.txt") == "héllo"
    assert storage.size("a/t.txt") == len("héllo".encode())
    storage.write_bytes("a/t.txt", b"replaced")
    assert storage.read_bytes("a/t.txt") == b"replaced"


def test_list_walk_exists(storage: Storage) -> None:
    for key in ("d/x.txt", "d/sub/y.txt", "d/sub/z.txt", "e.txt"):
        storage.write_text(key, key)
    assert storage.list() == ["d", "e.txt"]
    assert storage.list("d") == ["sub", "x.txt"]
    assert storage.walk_files("d") == {"sub/y.txt": 11, "sub/z.txt": 11, "x.txt": 7}
    assert storage.exists("d/sub/y.txt") and storage.exists("d") and not storage.exists("nope")
    assert storage.is_dir("d/sub") and not storage.is_dir("e.txt")


def test_delete(storage: Storage) -> None:
    storage.write_text("d/x.txt", "x")
    storage.write_text("d/sub/y.txt", "y")
    storage.delete("d/x.txt")
    assert not storage.exists("d/x.txt")
    storage.delete("d", recursive=True)
    assert not storage.exists("d")
    with pytest.raises(StorageNotFoundError, match="not found"):
        storage.delete("d/x.txt")
    storage.delete("d/x.txt", missing_ok=True)
    with pytest.raises(ValueError, match="storage root"):
        storage.delete("")


def test_missing_file_is_a_typed_not_found(storage: Storage) -> None:
    with pytest.raises(StorageNotFoundError) as info:
        storage.read_bytes("nope/x.bin")
    assert isinstance(info.value, FileNotFoundError)  # code written for open() keeps working
    assert storage.url_for("nope/x.bin") in str(info.value)
    with pytest.raises(StorageNotFoundError):
        storage.list("nope")


def test_open_streams(storage: Storage) -> None:
    with storage.open("s/stream.bin", "wb") as handle:
        handle.write(b"abc")
        handle.write(b"def")
    with storage.open("s/stream.bin") as handle:
        assert handle.read() == b"abcdef"


def test_child_shares_the_filesystem(storage: Storage) -> None:
    child = storage.child("runs/r1")
    child.write_text("f.txt", "x")
    assert storage.read_text("runs/r1/f.txt") == "x"
    assert child.url_for("f.txt") == storage.url_for("runs/r1/f.txt")
    assert str(child.url).endswith("/root/runs/r1")


def test_keys_may_not_escape_the_root(storage: Storage) -> None:
    from storage import StorageConfigError

    with pytest.raises(StorageConfigError, match="climbs above"):
        storage.write_text("../outside.txt", "x")


def test_reading_a_directory_is_an_io_error(tmp_path: Path) -> None:
    storage = Storage.from_url(tmp_path)
    storage.makedirs("dir")
    with pytest.raises(StorageIOError, match="IsADirectoryError"):
        storage.read_bytes("dir")


def test_describe_has_no_secrets() -> None:
    pytest.importorskip("s3fs")
    storage = Storage.from_url(
        "s3://bkt/p", {"key": "AKIAVERYSECRETKEY", "secret": "sekret", "endpoint_url": "http://127.0.0.1:1"}
    )
    text = repr(storage) + str(storage.describe())
    assert "sekret" not in text and "AKIAVERYSECRETKEY" not in text
    assert storage.describe()["endpoint_url"] == "http://127.0.0.1:1"
