"""Atomic writes never expose a partial file; committed directories are the only ones readers see."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from storage import COMMIT_MARKER, CommitError, Storage, list_uncommitted, read_commit, verify_commit
from storage.atomic import TEMP_PREFIX


@pytest.fixture(params=["file", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "file":
        return Storage.from_url(tmp_path / "root")
    return Storage.from_url(f"memory://commit-{uuid.uuid4().hex}")


# -- atomic writes --------------------------------------------------------------------------------


def test_atomic_write_publishes_only_on_success(storage: Storage) -> None:
    storage.write_text("f.txt", "old")
    with storage.atomic_write("f.txt") as handle:
        handle.write(b"new, first half")
        assert storage.read_text("f.txt") == "old"  # nothing visible while writing
        handle.write(b" and second half")
    assert storage.read_text("f.txt") == "new, first half and second half"


def test_atomic_write_failure_keeps_old_content_and_leaves_no_temp(storage: Storage) -> None:
    storage.write_text("d/f.txt", "old")
    with pytest.raises(RuntimeError, match="boom"), storage.atomic_write("d/f.txt") as handle:
        handle.write(b"partial")
        raise RuntimeError("boom")
    assert storage.read_text("d/f.txt") == "old"
    assert storage.list("d") == ["f.txt"]
    with pytest.raises(RuntimeError), storage.atomic_write("d/new.txt") as handle:
        handle.write(b"partial")
        raise RuntimeError("boom")
    assert not storage.exists("d/new.txt")


def test_concurrent_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    storage = Storage.from_url(tmp_path)
    size = 1 << 20
    contents = [b"A" * size, b"B" * size]
    storage.write_bytes("big.bin", contents[0])
    stop = threading.Event()
    torn: list[int] = []
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            data = storage.read_bytes("big.bin")
            reads[0] += 1
            if data not in contents:
                torn.append(len(data))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(40):
            storage.write_bytes("big.bin", contents[i % 2])
    finally:
        stop.set()
        thread.join()
    assert reads[0] > 0
    assert torn == []


def test_writer_killed_mid_write_leaves_no_file(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from storage import Storage\n"
        f"s = Storage.from_url({str(tmp_path)!r})\n"
        "with s.atomic_write('ckpt.bin') as f:\n"
        "    f.write(b'x' * 4096); f.flush()\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    names = os.listdir(tmp_path)
    assert "ckpt.bin" not in names
    assert len(names) == 1 and names[0].startswith(TEMP_PREFIX + "ckpt.bin")  # the only trace: a hidden temp


# -- directory commits ---------------------------------------------------------------------------


def test_staged_directory_is_invisible_until_committed(storage: Storage) -> None:
    with storage.staged_directory("ckpt/step_1", metadata={"step": 1}) as d:
        d.write_bytes("model/shard0.bin", b"0" * 10)
        d.write_text("meta.json", "{}")
        assert storage.list_committed("ckpt") == []
        assert not storage.is_committed("ckpt/step_1")
    assert storage.list_committed("ckpt") == ["step_1"]
    marker = read_commit(storage, "ckpt/step_1")
    assert marker["files"] == {"meta.json": 2, "model/shard0.bin": 10}
    assert marker["metadata"] == {"step": 1}
    assert verify_commit(storage, "ckpt/step_1") == []
    assert storage.list("ckpt") == ["step_1"]  # no staging area left behind


def test_local_staging_is_a_hidden_sibling_renamed_into_place(tmp_path: Path) -> None:
    storage = Storage.from_url(tmp_path)
    with storage.staged_directory("ckpt/step_1") as d:
        d.write_text("x", "1")
        assert not (tmp_path / "ckpt/step_1").exists()
        (stage,) = os.listdir(tmp_path / "ckpt")
        assert stage.startswith(".staging-step_1-")
    assert sorted(os.listdir(tmp_path / "ckpt/step_1")) == [COMMIT_MARKER, "x"]


def test_failed_staged_directory_is_discarded(storage: Storage) -> None:
    with pytest.raises(RuntimeError, match="crash"), storage.staged_directory("ckpt/step_2") as d:
        d.write_text("partial.bin", "x")
        raise RuntimeError("crash")
    assert storage.list_committed("ckpt") == []
    assert not storage.exists("ckpt/step_2")
    assert list_uncommitted(storage, "ckpt") == []


def test_uncommitted_leftovers_are_ignored_then_replaced(storage: Storage) -> None:
    storage.write_text("ckpt/step_3/stale.bin", "from a crashed run")
    storage.write_text("ckpt/step_4/a.bin", "a")
    storage.commit_directory("ckpt/step_4")
    assert storage.list_committed("ckpt") == ["step_4"]
    assert list_uncommitted(storage, "ckpt") == ["step_3"]
    with storage.staged_directory("ckpt/step_3") as d:
        d.write_text("fresh.bin", "new")
    assert storage.list_committed("ckpt") == ["step_3", "step_4"]
    assert read_commit(storage, "ckpt/step_3")["files"] == {"fresh.bin": 3}
    assert not storage.exists("ckpt/step_3/stale.bin")


def test_committing_twice_is_refused(storage: Storage) -> None:
    storage.write_text("c/x", "1")
    storage.commit_directory("c")
    with pytest.raises(CommitError, match="already committed"):
        storage.commit_directory("c")
    with pytest.raises(CommitError, match="already committed"), storage.staged_directory("c"):
        pass


def test_verify_commit_finds_missing_and_changed_files(storage: Storage) -> None:
    storage.write_text("c/a", "1")
    storage.write_text("c/b", "22")
    storage.commit_directory("c")
    storage.delete("c/a")
    storage.write_text("c/b", "333")
    assert verify_commit(storage, "c") == ["a: missing", "b: size 3 != 2 recorded at commit"]


def test_corrupt_marker_is_a_commit_error(storage: Storage) -> None:
    storage.write_text(f"c/{COMMIT_MARKER}", "{not json")
    with pytest.raises(CommitError, match="not valid JSON"):
        read_commit(storage, "c")


def test_list_committed_of_a_missing_directory_is_empty(storage: Storage) -> None:
    assert storage.list_committed("never/written") == []
