"""The disk reader turns every bad weight directory into WeightTransportError before any tensor is used.

A garbage or truncated ``.safetensors``, an index that is not JSON, lacks ``weight_map`` or maps
to non-strings, a missing shard, and a tensor stored in two shards each fail with a message that
says what is wrong (the server answers it as a 400), never as a SafetensorError, KeyError or
TypeError (which were 500s and left ``/areal/swap_weights`` paused).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from areal_tasks.errors import WeightTransportError
from areal_tasks.models.safetensors_dir import INDEX_FILE
from areal_tasks.weights.base import ServedWeights, WeightLoad
from areal_tasks.weights.disk import DiskReceiver, iter_safetensors, load_safetensors_dir, safetensors_files

A, B = torch.arange(6.0).reshape(2, 3), torch.ones(4)


def sharded(directory: Path, weight_map: object = None) -> Path:
    """``a`` in shard 1, ``b`` in shard 2, and an index (``weight_map`` overridable)."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file({"a": A}, str(directory / "s1.safetensors"))
    save_file({"b": B}, str(directory / "s2.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}
    if weight_map is not None:
        index["weight_map"] = weight_map
    (directory / INDEX_FILE).write_text(json.dumps(index))
    return directory


def test_a_good_sharded_directory_loads(tmp_path: Path) -> None:
    got = DiskReceiver(torch.device("cpu")).receive(WeightLoad(path=str(sharded(tmp_path / "w"))))
    assert torch.equal(got["a"], A) and torch.equal(got["b"], B)
    served = ServedWeights({"a": ((2, 3), torch.float32), "b": ((4,), torch.float32)}, {"a", "b"})
    assert set(load_safetensors_dir(tmp_path / "w", served, torch.device("cpu"))) == {"a", "b"}


def test_garbage_safetensors_is_a_transport_error(tmp_path: Path) -> None:
    directory = tmp_path / "garbage"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(os.urandom(4096))
    with pytest.raises(WeightTransportError, match="model.safetensors is not a readable safetensors file"):
        DiskReceiver(torch.device("cpu")).receive(WeightLoad(path=str(directory)))


def test_a_truncated_shard_fails_before_any_tensor_is_yielded(tmp_path: Path) -> None:
    directory = sharded(tmp_path / "w")
    data = (directory / "s2.safetensors").read_bytes()
    (directory / "s2.safetensors").write_bytes(data[: len(data) // 2])
    stream = iter_safetensors(safetensors_files(directory))
    with pytest.raises(WeightTransportError, match="s2.safetensors is not a readable safetensors file"):
        next(stream)  # s1 is fine, but nothing comes out before every header was checked


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ("{not json", "is not valid JSON"),
        (b"\xff\xfe", "is not valid JSON"),
        ('{"metadata": {}}', "has no 'weight_map' object"),
        ('["s1.safetensors"]', "has no 'weight_map' object"),
        ('{"weight_map": ["s1.safetensors"]}', "has no 'weight_map' object"),
        ('{"weight_map": {}}', "has no 'weight_map' object"),
        ('{"weight_map": {"a": 1}}', "values must be shard file names"),
    ],
)
def test_a_bad_index_is_a_transport_error(tmp_path: Path, index: str | bytes, message: str) -> None:
    directory = sharded(tmp_path / "w")
    path = directory / INDEX_FILE
    path.write_bytes(index if isinstance(index, bytes) else index.encode())
    with pytest.raises(WeightTransportError, match=message):
        safetensors_files(directory)


def test_a_missing_shard_is_a_transport_error(tmp_path: Path) -> None:
    directory = sharded(tmp_path / "w", {"a": "s1.safetensors", "b": "s3.safetensors"})
    with pytest.raises(WeightTransportError, match="'s3.safetensors' are missing or not readable"):
        safetensors_files(directory)


def test_a_tensor_stored_in_two_shards_is_refused(tmp_path: Path) -> None:
    directory = sharded(tmp_path / "w")
    save_file({"a": A * 2}, str(directory / "s2.safetensors"))
    with pytest.raises(WeightTransportError, match="tensor 'a' is stored twice: in s1.safetensors and s2.safetensors"):
        list(iter_safetensors(safetensors_files(directory)))


def test_a_directory_without_safetensors_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightTransportError, match="holds no \\*.safetensors file"):
        safetensors_files(tmp_path / "empty")
