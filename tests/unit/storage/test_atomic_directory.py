"""``atomic_directory``: a directory published in one rename, readable by other users, no half-written
directory after a failure, and never a deleted file that a writer of ours did not write.

Each mode (``refuse``, ``replace_owned``, ``merge_owned``, ``keep``) refuses a target that is not a
directory before any work; an existing directory is replaced only when it holds nothing but files an
earlier publish listed in its ``.areal-written.json``; every failure leaves no ``.tmp-*`` staging or
``.old-*`` directory behind.
"""

from __future__ import annotations

import json
import os

import pytest

from storage.atomic import atomic_directory
from storage.errors import StorageError
from storage.ownership import MANIFEST

MODES = ["refuse", "replace_owned", "merge_owned", "keep"]


def _names(path):
    return sorted(p.name for p in path.iterdir())


def _publish(target, files, on_exists):
    with atomic_directory(target, on_exists=on_exists) as staging:
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)


def test_replace_owned_replaces_what_it_wrote_and_cleans_up(tmp_path):
    target = tmp_path / "weights"
    _publish(target, {"a.txt": "old"}, "replace_owned")
    assert json.loads((target / MANIFEST).read_text())["files"] == ["a.txt"]
    with atomic_directory(target, on_exists="replace_owned") as staging:
        assert not (staging / "a.txt").exists()
        (staging / "b.txt").write_text("new")
    assert _names(target) == [MANIFEST, "b.txt"]
    assert (target / "b.txt").stat().st_mode & 0o044 == 0o044, "written files must be readable by other users (servers)"
    assert (target / MANIFEST).stat().st_mode & 0o044 == 0o044
    assert _names(tmp_path) == ["weights"]


def test_failed_write_leaves_the_old_directory(tmp_path):
    target = tmp_path / "weights"
    _publish(target, {"a.txt": "old"}, "replace_owned")
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(target, on_exists="replace_owned") as staging:
        (staging / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert (target / "a.txt").read_text() == "old"
    assert _names(tmp_path) == ["weights"]


@pytest.mark.parametrize("mode", MODES)
def test_a_file_target_is_refused_untouched_before_any_work(tmp_path, mode):
    target = tmp_path / "out"
    target.write_text("precious")
    ran = []
    with pytest.raises(StorageError, match="not a directory"), atomic_directory(target, on_exists=mode):
        ran.append(True)
    assert not ran, "the refusal must come before the caller's work"
    assert target.read_text() == "precious"
    assert _names(tmp_path) == ["out"], "no staging or .old sibling may be left"


@pytest.mark.parametrize("mode", ["refuse", "replace_owned", "merge_owned"])
def test_a_symlink_target_is_refused(tmp_path, mode):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "mine.txt").write_text("precious")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(StorageError, match="symbolic link"), atomic_directory(tmp_path / "link", on_exists=mode):
        pass
    assert (tmp_path / "real" / "mine.txt").read_text() == "precious"
    assert _names(tmp_path) == ["link", "real"]


@pytest.mark.parametrize("mode", ["refuse", "replace_owned"])
def test_a_directory_with_foreign_files_is_refused_untouched(tmp_path, mode):
    target = tmp_path / "out"
    target.mkdir()
    (target / "mine.txt").write_text("precious")
    with pytest.raises(StorageError, match="mine.txt"), atomic_directory(target, on_exists=mode):
        pass
    assert _names(target) == ["mine.txt"] and (target / "mine.txt").read_text() == "precious"
    assert _names(tmp_path) == ["out"]


def test_refuse_takes_an_absent_or_empty_directory_and_lists_what_it_wrote(tmp_path):
    (tmp_path / "empty").mkdir()
    _publish(tmp_path / "empty", {"a.txt": "a"}, "refuse")
    _publish(tmp_path / "new" / "deeper", {"b.txt": "b", "sub/c.txt": "c"}, "refuse")
    assert (tmp_path / "empty" / "a.txt").read_text() == "a"
    manifest = json.loads((tmp_path / "new" / "deeper" / MANIFEST).read_text())
    assert manifest["files"] == ["b.txt", "sub/c.txt"]
    with pytest.raises(StorageError, match="not empty"):
        _publish(tmp_path / "empty", {"a.txt": "again"}, "refuse")
    assert (tmp_path / "empty" / "a.txt").read_text() == "a"


def test_replace_owned_refuses_a_file_that_appeared_while_writing(tmp_path):
    target = tmp_path / "out"
    _publish(target, {"a.txt": "old"}, "replace_owned")
    with pytest.raises(StorageError, match="late.txt"), atomic_directory(target, on_exists="replace_owned") as staging:
        (staging / "a.txt").write_text("new")
        (target / "late.txt").write_text("someone else's")
    assert (target / "a.txt").read_text() == "old" and (target / "late.txt").read_text() == "someone else's"
    assert _names(tmp_path) == ["out"]


def test_an_edited_manifest_cannot_claim_more_than_it_lists(tmp_path):
    """An unreadable manifest owns nothing: the directory is refused, not deleted."""
    target = tmp_path / "out"
    _publish(target, {"a.txt": "old"}, "replace_owned")
    (target / MANIFEST).write_text("{not json")
    with pytest.raises(StorageError, match="a.txt"):
        _publish(target, {"a.txt": "new"}, "replace_owned")
    assert (target / "a.txt").read_text() == "old"


@pytest.mark.parametrize("where", ["block", "publish"])
def test_no_staging_or_old_directory_is_left_after_a_failure(tmp_path, monkeypatch, where):
    target = tmp_path / "out"
    _publish(target, {"a.txt": "old"}, "replace_owned")
    if where == "publish":
        real_rename = os.rename

        def failing_rename(src, dst):
            if ".tmp-" in os.fspath(src):  # the staging directory moving into place
                raise OSError(28, "No space left on device")
            return real_rename(src, dst)

        monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises((RuntimeError, StorageError)), atomic_directory(target, on_exists="replace_owned") as staging:
        (staging / "a.txt").write_text("new")
        if where == "block":
            raise RuntimeError("boom")
    assert (target / "a.txt").read_text() == "old"
    assert _names(tmp_path) == ["out"], "no staging or .old sibling may be left"


def test_merge_owned_keeps_foreign_files_and_replaces_only_its_own(tmp_path):
    target = tmp_path / "out"
    _publish(target, {"config.json": "v1", "model-1.bin": "w1", "shards/x.bin": "x"}, "refuse")
    (target / "notes.txt").write_text("precious")
    _publish(target, {"config.json": "v2", "model.bin": "w2"}, "merge_owned")
    assert (target / "notes.txt").read_text() == "precious"
    assert (target / "config.json").read_text() == "v2" and (target / "model.bin").read_text() == "w2"
    assert not (target / "model-1.bin").exists() and not (target / "shards").exists(), "a stale file of ours goes"
    assert json.loads((target / MANIFEST).read_text())["files"] == ["config.json", "model.bin"]
    assert _names(tmp_path) == ["out"]


def test_merge_owned_without_foreign_files_replaces_in_one_swap(tmp_path):
    target = tmp_path / "out"
    _publish(target, {"a.txt": "1", "b.txt": "1"}, "refuse")
    _publish(target, {"a.txt": "2"}, "merge_owned")
    assert _names(target) == [MANIFEST, "a.txt"] and (target / "a.txt").read_text() == "2"


def test_merge_owned_never_overwrites_a_foreign_file(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "config.json").write_text("the user's")
    (target / "notes.txt").write_text("precious")
    with pytest.raises(StorageError, match="config.json"):
        _publish(target, {"config.json": "ours", "model.bin": "w"}, "merge_owned")
    assert _names(target) == ["config.json", "notes.txt"] and (target / "config.json").read_text() == "the user's"
    assert _names(tmp_path) == ["out"]


def test_a_parent_that_is_a_file_is_a_storage_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StorageError, match="afile"), atomic_directory(tmp_path / "afile" / "sub"):
        pass
    assert (tmp_path / "afile").read_text() == "x"


def test_keep_publishes_the_first_copy_and_discards_later_ones(tmp_path):
    """``keep`` (content-addressed entries): a copy that another process published while this one was
    writing is kept, and this one's staging directory is discarded."""
    target = tmp_path / "entry"
    with atomic_directory(target, on_exists="keep") as staging:
        (staging / "mine.txt").write_text("loser")
        target.mkdir()  # another process finishes first
        (target / "theirs.txt").write_text("winner")
    assert _names(target) == ["theirs.txt"]
    assert _names(tmp_path) == ["entry"]
    _publish(tmp_path / "fresh", {"a.txt": "a"}, "keep")
    assert _names(tmp_path / "fresh") == ["a.txt"], "cache entries carry no manifest"
    assert (tmp_path / "fresh" / "a.txt").stat().st_mode & 0o044 == 0o044


def test_keep_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(tmp_path / "entry", on_exists="keep") as staging:
        (staging / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_staging_directory_written_elsewhere_is_published_in_one_rename(tmp_path):
    """The multi-process form (one process stages, several write, one publishes)."""
    from storage.atomic import publish_directory, staging_directory

    target = tmp_path / "ckpt"
    _publish(target, {"old.bin": "0"}, "replace_owned")
    staging = staging_directory(target)
    assert staging.parent == tmp_path and staging.name.startswith(".ckpt.tmp-") and not any(staging.iterdir())
    (staging / "rank0.bin").write_bytes(b"a")
    (staging / "rank1.bin").write_bytes(b"b")
    publish_directory(staging, target, on_exists="replace_owned")
    assert _names(target) == [MANIFEST, "rank0.bin", "rank1.bin"]
    assert _names(tmp_path) == ["ckpt"]
