"""The atomic build-then-rename cache: races and failures leave no partial entries."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.models.tiny.cache import content_hash, get_or_build


def _leftovers(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(".")]


def test_builds_once_then_hits(tmp_path: Path) -> None:
    calls: list[Path] = []

    def build(tmp: Path) -> None:
        calls.append(tmp)
        (tmp / "a.txt").write_text("x")

    first = get_or_build(tmp_path, "entry", build)
    second = get_or_build(tmp_path, "entry", build)
    assert first == second == tmp_path / "entry" and len(calls) == 1
    assert (first / "a.txt").read_text() == "x" and not _leftovers(tmp_path)


def test_losing_a_race_keeps_the_winner(tmp_path: Path) -> None:
    def build_while_another_process_finishes(tmp: Path) -> None:
        (tmp / "mine.txt").write_text("loser")
        winner = tmp_path / "entry"
        winner.mkdir()
        (winner / "theirs.txt").write_text("winner")

    path = get_or_build(tmp_path, "entry", build_while_another_process_finishes)
    assert sorted(p.name for p in path.iterdir()) == ["theirs.txt"]
    assert not _leftovers(tmp_path)


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def broken(tmp: Path) -> None:
        (tmp / "half.txt").write_text("partial")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        get_or_build(tmp_path, "entry", broken)
    assert list(tmp_path.iterdir()) == []


def test_content_hash_ignores_key_order() -> None:
    assert content_hash({"a": 1, "b": [1, 2]}) == content_hash({"b": [1, 2], "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})
