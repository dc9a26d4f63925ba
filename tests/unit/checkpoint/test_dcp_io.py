"""DCP through Storage in one process: dtypes and objects round-trip, identical items are referenced
(not rewritten) against a parent, pickled objects load with weights_only, ranged reads coalesce."""

from __future__ import annotations

import uuid
from fractions import Fraction

import pytest
import torch

from areal_tasks.checkpoint import dcp_read
from areal_tasks.checkpoint.dcp_index import ItemRecord
from areal_tasks.checkpoint.dcp_io import StorageDCPWriter, dcp_save
from areal_tasks.checkpoint.dcp_read import StorageDCPReader, dcp_load
from areal_tasks.checkpoint.incremental import ParentIndex, references_of
from areal_tasks.errors import CheckpointError
from storage import Storage


@pytest.fixture
def store() -> Storage:
    return Storage.from_url(f"memory://dcp-{uuid.uuid4().hex[:12]}")


def _state(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "f32": torch.randn(7, 5, generator=gen),
        "bf16": torch.randn(33, generator=gen).to(torch.bfloat16),
        "i64": torch.arange(11),
        "mask": torch.rand(9, generator=gen) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "strided": torch.randn(6, 4, generator=gen).t(),
        "nested": {"lr": 0.1, "betas": (0.9, 0.95), "name": "adamw", "ids": [1, 2, 3]},
    }


def _zeros_like(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        out[key] = torch.zeros_like(value) if isinstance(value, torch.Tensor) else dict.fromkeys(value)
    return out


def test_round_trip_of_tensors_and_objects(store):
    state = _state()
    writer = StorageDCPWriter(store, "step_1")
    dcp_save(state, writer, None, False)
    loaded = _zeros_like(state)
    dcp_load(loaded, StorageDCPReader(store, "step_1", verify=True), None, False)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key
    assert loaded["nested"] == {"lr": 0.1, "betas": (0.9, 0.95), "name": "adamw", "ids": [1, 2, 3]}
    assert writer.stats.referenced == 0 and writer.stats.files["dcp/rank-00000.distcp"].size == writer.stats.written


def test_unchanged_items_are_referenced_not_rewritten(store):
    first = _state()
    dcp_save(first, StorageDCPWriter(store, "step_1"), None, False)
    second = dict(first, f32=first["f32"] + 1, i64=first["i64"].to(torch.int32).to(torch.int64))
    second["mask"] = first["mask"].to(torch.uint8)  # same bytes, another dtype: must be written
    writer = StorageDCPWriter(store, "step_2", ParentIndex.load(store, "step_1"))
    dcp_save(second, writer, None, False)
    records = {r.fqn: r for r in writer.records}
    assert records["f32"].dir == "step_2" and records["mask"].dir == "step_2"
    assert records["bf16"].dir == "step_1" and records["i64"].dir == "step_1" and records["strided"].dir == "step_1"
    assert references_of(writer.records, "step_2") == {"step_1": ["dcp/rank-00000.distcp"]}
    assert writer.stats.referenced > 0 and writer.stats.written < writer.stats.logical
    loaded = _zeros_like(second)
    dcp_load(loaded, StorageDCPReader(store, "step_2", verify=True), None, False)
    for key, value in second.items():
        if isinstance(value, torch.Tensor):
            assert loaded[key].dtype == value.dtype and torch.equal(loaded[key], value), key


def test_objects_load_with_weights_only(store):
    dcp_save({"obj": Fraction(1, 3)}, StorageDCPWriter(store, "step_1"), None, False)
    with pytest.raises(CheckpointError, match="Unpickling|weights_only|Weights only"):
        dcp_load({"obj": None}, StorageDCPReader(store, "step_1"), None, False)


def test_missing_items_and_truncated_files_fail_clearly(store):
    dcp_save({"a": torch.ones(1000)}, StorageDCPWriter(store, "step_1"), None, False)
    with pytest.raises(CheckpointError, match="Missing key|missing"):
        dcp_load({"a": torch.zeros(1000), "b": torch.zeros(2)}, StorageDCPReader(store, "step_1"), None, False)
    store.write_bytes("step_1/dcp/rank-00000.distcp", store.read_bytes("step_1/dcp/rank-00000.distcp")[:100])
    with pytest.raises(CheckpointError, match="truncated"):
        dcp_load({"a": torch.zeros(1000)}, StorageDCPReader(store, "step_1"), None, False)


def _rec(pos: int, length: int) -> ItemRecord:
    return ItemRecord("x", None, "bytes", "step_1", "f", pos, length, "h")


def test_reads_coalesce_nearby_items_up_to_a_span(monkeypatch):
    monkeypatch.setattr(dcp_read, "MAX_READ_SPAN", 1000)
    reqs = [(i, _rec(pos, n)) for i, (pos, n) in enumerate([(0, 100), (128, 100), (5000, 10), (5064, 900), (6000, 50)])]
    spans = [(start, end, [i for i, _ in group]) for start, end, group in dcp_read.read_spans(reqs)]
    assert spans == [(0, 228, [0, 1]), (5000, 5964, [2, 3]), (6000, 6050, [4])]
