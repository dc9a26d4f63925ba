"""Weight loads read only inside the server's weight roots; shared buffers only the trainer's files.

An index entry with ``..`` or an absolute name, a shard or a directory that is a symlink out of the
roots, and a directory outside the roots are refused; the message for a path outside the roots is
the same whether it exists or not (no existence oracle). A shared-memory description may name only
a regular file ``areal-weights-*`` of this user directly in the shared-memory directory:
``/etc/passwd``, a library, a symlink, another name or directory are refused.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import areal_tasks.weights.shared_buffer as shared
from areal_tasks.errors import WeightTransportError
from areal_tasks.models.safetensors_dir import INDEX_FILE
from areal_tasks.weights.disk import safetensors_files
from areal_tasks.weights.roots import WeightRoots, not_readable, roots_from_env
from areal_tasks.weights.shared_buffer import SharedWeightBuffer, open_shared_buffer


def model_dir(path: Path, weight_map: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    save_file({"a": torch.zeros(2)}, str(path / "model.safetensors"))
    if weight_map is not None:
        (path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    return path


def message(exc: pytest.ExceptionInfo) -> str:
    return str(exc.value)


@pytest.fixture
def layout(tmp_path: Path) -> tuple[WeightRoots, Path, Path]:
    """``roots = [allowed]``; ``outside`` holds a loadable model directory next to it."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    model_dir(outside / "model")
    allowed.mkdir()
    return WeightRoots.of([allowed]), allowed, outside


def test_a_directory_inside_the_roots_loads(layout) -> None:
    roots, allowed, _ = layout
    model_dir(allowed / "v1")
    assert safetensors_files(allowed / "v1", roots) == [(allowed / "v1" / "model.safetensors").resolve()]


def test_a_directory_outside_the_roots_reads_like_a_missing_one(layout) -> None:
    roots, allowed, outside = layout
    with pytest.raises(WeightTransportError) as existing:
        safetensors_files(outside / "model", roots)
    with pytest.raises(WeightTransportError) as missing:
        safetensors_files(outside / "nothing-here", roots)
    with pytest.raises(WeightTransportError) as dotdot:
        safetensors_files(allowed / ".." / "outside" / "model", roots)
    assert message(existing) == str(not_readable(outside / "model"))
    assert message(missing) == str(not_readable(outside / "nothing-here"))
    # the messages differ only by the path the caller sent
    assert message(existing).replace(str(outside / "model"), "P") == message(missing).replace(
        str(outside / "nothing-here"), "P"
    )
    assert "No such file" not in message(missing)
    assert message(dotdot) == str(not_readable(allowed / ".." / "outside" / "model"))


def test_a_symlinked_directory_out_of_the_roots_is_refused(layout) -> None:
    roots, allowed, outside = layout
    (allowed / "link").symlink_to(outside / "model")
    with pytest.raises(WeightTransportError, match="missing or not readable"):
        safetensors_files(allowed / "link", roots)


@pytest.mark.parametrize("shard", ["../outside/model/model.safetensors", "ABSOLUTE", "sub/../../x.safetensors"])
def test_index_entries_that_leave_the_directory_are_refused(layout, shard: str) -> None:
    roots, allowed, outside = layout
    if shard == "ABSOLUTE":
        shard = str(outside / "model" / "model.safetensors")
    model_dir(allowed / "v1", {"a": shard})
    with pytest.raises(WeightTransportError) as refused:
        safetensors_files(allowed / "v1", roots)
    assert message(refused) == str(not_readable(shard))


def test_a_shard_symlinked_out_of_the_roots_is_refused_like_a_missing_one(layout) -> None:
    roots, allowed, outside = layout
    directory = model_dir(allowed / "v1", {"a": "model.safetensors", "b": "escape.safetensors"})
    (directory / "escape.safetensors").symlink_to(outside / "model" / "model.safetensors")
    with pytest.raises(WeightTransportError) as escaping:
        safetensors_files(directory, roots)
    (directory / "escape.safetensors").unlink()
    (directory / "escape.safetensors").symlink_to(outside / "model" / "gone.safetensors")
    with pytest.raises(WeightTransportError) as dangling:
        safetensors_files(directory, roots)
    assert message(escaping) == message(dangling) == str(not_readable("escape.safetensors"))


def test_a_globbed_shard_symlinked_out_is_refused_too(layout) -> None:
    roots, allowed, outside = layout
    directory = model_dir(allowed / "v1")
    (directory / "zz.safetensors").symlink_to(outside / "model" / "model.safetensors")
    with pytest.raises(WeightTransportError, match="'zz.safetensors' are missing or not readable"):
        safetensors_files(directory, roots)


def test_without_roots_the_directory_is_its_own_root(tmp_path: Path) -> None:
    model_dir(tmp_path / "other")
    directory = model_dir(tmp_path / "w", {"a": "../other/model.safetensors"})
    with pytest.raises(WeightTransportError, match="missing or not readable"):
        safetensors_files(directory)


def test_a_hugging_face_snapshot_may_point_into_its_blobs(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    save_file({"a": torch.zeros(2)}, str(repo / "blobs" / "0123abcd"))
    snapshot = repo / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(repo / "blobs" / "0123abcd")
    assert safetensors_files(snapshot, WeightRoots.of([snapshot])) == [repo / "blobs" / "0123abcd"]


def test_roots_from_the_environment() -> None:
    assert roots_from_env({"AREAL_WEIGHT_ROOTS": f"/a{os.pathsep}{os.pathsep}/b"}) == ["/a", "/b"]
    assert roots_from_env({}) == []


# -- shared-memory buffers ---------------------------------------------------------------------


def refused_path(path: str, nbytes: int = 8) -> str:
    with pytest.raises(WeightTransportError) as refused:
        open_shared_buffer({"kind": "file", "id": "x", "nbytes": nbytes, "path": path})
    return str(refused.value)


def test_a_trainers_buffer_opens() -> None:
    buffer = SharedWeightBuffer(8, torch.device("cpu"))
    try:
        buffer.flat.copy_(torch.arange(8, dtype=torch.uint8))
        assert open_shared_buffer(buffer.describe()).tolist() == list(range(8))
    finally:
        buffer.close()


@pytest.mark.parametrize("path", ["/etc/passwd", torch.__file__, "/dev/shm/../etc/passwd", "", "relative"])
def test_files_that_are_not_a_trainers_buffer_are_refused(path: str) -> None:
    assert "not an areal weight buffer" in refused_path(path)


def test_refusals_do_not_tell_whether_the_file_exists(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(shared, "_shm_dir", lambda: tmp_path)
    name = "areal-weights-1-2-abc"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / name).write_bytes(b"x" * 64)
    existing, missing = refused_path(str(outside / name)), refused_path(str(outside / "areal-weights-1-2-def"))
    assert re.sub(r"'[^']*'", "P", existing, count=1) == re.sub(r"'[^']*'", "P", missing, count=1)
    gone = refused_path(str(tmp_path / name))  # right place and name, but no such file
    assert re.sub(r"'[^']*'", "P", gone, count=1) == re.sub(r"'[^']*'", "P", missing, count=1)


def test_symlinks_other_names_and_short_files_in_the_shm_dir_are_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(shared, "_shm_dir", lambda: tmp_path)
    (tmp_path / "areal-weights-1-2-abc").symlink_to("/etc/passwd")
    (tmp_path / "other-1-2-abc").write_bytes(b"x" * 64)
    (tmp_path / "areal-weights-1-2-def").write_bytes(b"x" * 4)
    (tmp_path / "areal-weights-1-2-fff").mkdir()
    for name in ("areal-weights-1-2-abc", "other-1-2-abc", "areal-weights-1-2-def", "areal-weights-1-2-fff"):
        assert "not an areal weight buffer" in refused_path(str(tmp_path / name))
    (tmp_path / "areal-weights-1-2-aaa").write_bytes(b"x" * 64)
    assert open_shared_buffer({"kind": "file", "nbytes": 8, "path": str(tmp_path / "areal-weights-1-2-aaa")}).numel()


def test_a_file_of_another_user_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(shared, "_shm_dir", lambda: tmp_path)
    (tmp_path / "areal-weights-1-2-abc").write_bytes(b"x" * 64)
    monkeypatch.setattr(shared.os, "getuid", lambda: os.stat(tmp_path).st_uid + 1)
    assert "not an areal weight buffer" in refused_path(str(tmp_path / "areal-weights-1-2-abc"))
