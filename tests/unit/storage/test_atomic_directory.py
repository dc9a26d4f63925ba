"""``atomic_directory``: a directory replaced in one rename, readable by other users, and no
half-written directory after a failure."""

from __future__ import annotations

import pytest

from storage.atomic import atomic_directory


def test_atomic_directory_replaces_and_cleans_up(tmp_path):
    target = tmp_path / "weights"
    with atomic_directory(target) as staging:
        (staging / "a.txt").write_text("old")
    with atomic_directory(target) as staging:
        assert not (staging / "a.txt").exists()
        (staging / "b.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert (target / "b.txt").stat().st_mode & 0o044 == 0o044, "written files must be readable by other users (servers)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights"]


def test_failed_write_leaves_the_old_directory(tmp_path):
    target = tmp_path / "weights"
    with atomic_directory(target) as staging:
        (staging / "a.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(target) as staging:
        (staging / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert (target / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights"]


def test_without_replace_the_first_published_copy_wins(tmp_path):
    """``replace=False`` (content-addressed entries): a copy that another process published while
    this one was writing is kept, and this one's staging directory is discarded."""
    target = tmp_path / "entry"
    with atomic_directory(target, replace=False) as staging:
        (staging / "mine.txt").write_text("loser")
        target.mkdir()  # another process finishes first
        (target / "theirs.txt").write_text("winner")
    assert sorted(p.name for p in target.iterdir()) == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]
    with atomic_directory(tmp_path / "fresh", replace=False) as staging:
        (staging / "a.txt").write_text("a")
    assert (tmp_path / "fresh" / "a.txt").read_text() == "a"
    assert (tmp_path / "fresh" / "a.txt").stat().st_mode & 0o044 == 0o044


def test_without_replace_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), atomic_directory(tmp_path / "entry", replace=False) as staging:
        (staging / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_staging_directory_written_elsewhere_is_published_in_one_rename(tmp_path):
    """The multi-process form (one process stages, several write, one publishes)."""
    from storage.atomic import publish_directory, staging_directory

    target = tmp_path / "ckpt"
    with atomic_directory(target) as staging:
        (staging / "old.bin").write_bytes(b"0")
    staging = staging_directory(target)
    assert staging.parent == tmp_path and staging.name.startswith(".ckpt.tmp-") and not any(staging.iterdir())
    (staging / "rank0.bin").write_bytes(b"a")
    (staging / "rank1.bin").write_bytes(b"b")
    publish_directory(staging, target)
    assert sorted(p.name for p in target.iterdir()) == ["rank0.bin", "rank1.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
