"""Sharded safetensors: the HF layout and its index."""

from __future__ import annotations

import json

import torch

from areal_tasks.models.safetensors_dir import (
    INDEX_FILE,
    SINGLE_FILE,
    plan_shards,
    read_safetensors_dir,
    write_safetensors_shards,
)


def _tensors():
    tensors = {f"layer.{i}.weight": torch.full((4, 4), float(i)) for i in range(5)}
    return tensors | {"bf": torch.ones(3, dtype=torch.bfloat16)}


def test_plan_shards_keeps_order_and_isolates_big_tensors():
    assert plan_shards({"a": 4, "b": 4, "c": 10, "d": 1}, 8) == [["a", "b"], ["c"], ["d"]]


def test_single_file_under_the_limit(tmp_path):
    assert write_safetensors_shards(_tensors(), tmp_path) == [SINGLE_FILE]
    back = read_safetensors_dir(tmp_path)
    assert set(back) == set(_tensors()) and back["bf"].dtype == torch.bfloat16


def test_sharded_with_index(tmp_path):
    files = write_safetensors_shards(_tensors(), tmp_path, max_shard_bytes=130)
    assert len(files) > 1 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(_tensors())
    back = read_safetensors_dir(tmp_path)
    for name, tensor in _tensors().items():
        assert torch.equal(back[name], tensor)
