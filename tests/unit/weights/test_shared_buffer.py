"""Shared-memory weight buffers (``weights/shared_buffer.py``) on CPU: what the trainer packs,
another process reads through the JSON description alone; every malformed or unreachable
description fails with an error that names what is wrong; the wire record round-trips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import ConfigError, WeightTransportError
from areal_tasks.weights.buckets import flatten_bucket, spec_of
from areal_tasks.weights.shared_buffer import SharedWeightBuffer, open_shared_buffer, pick_buffer, shared_layout


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(7, 4, generator=g),
        "norm.weight": torch.randn(4, generator=g).to(torch.bfloat16),
        "steps": torch.tensor([3], dtype=torch.int64),
        "head.weight": torch.randn(5, 4, generator=g),
    }


def test_layout_aligns_every_tensor_to_its_element_size() -> None:
    layout = shared_layout([spec_of(n, t) for n, t in tensors().items()])
    offset = 0
    for spec in layout:
        assert offset % spec.itemsize == 0, spec
        offset += spec.nbytes
    assert [s.itemsize for s in layout] == sorted((s.itemsize for s in layout), reverse=True)
    with pytest.raises(WeightTransportError, match="at least one tensor"):
        shared_layout([])


READER = """
import json, sys, torch
from areal_tasks.weights.shared_buffer import open_shared_buffer
description, layout = json.loads(sys.argv[1]), json.loads(sys.argv[2])
flat, offset, out = open_shared_buffer(description), 0, {}
for name, dtype, shape, nbytes in layout:
    out[name] = flat[offset:offset + nbytes].view(getattr(torch, dtype)).reshape(shape).double().sum().item()
    offset += nbytes
print(json.dumps(out))
"""


def read_in_another_process(buffer: SharedWeightBuffer, layout) -> dict[str, float]:
    wire = [[s.name, s.dtype, list(s.shape), s.nbytes] for s in layout]
    done = subprocess.run(
        [sys.executable, "-c", READER, json.dumps(buffer.describe()), json.dumps(wire)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)


def test_another_process_reads_what_was_packed_and_each_repack() -> None:
    named = tensors()
    layout = shared_layout([spec_of(n, t) for n, t in named.items()])
    buffer = SharedWeightBuffer(sum(s.nbytes for s in layout), torch.device("cpu"))
    try:
        json.dumps(buffer.describe())  # JSON-safe: it travels in an HTTP body
        buffer.pack(layout, named.items())
        expected = {n: t.double().sum().item() for n, t in named.items()}
        assert read_in_another_process(buffer, layout) == pytest.approx(expected)
        doubled = {n: t * 2 for n, t in named.items()}
        buffer.pack(layout, reversed(list(doubled.items())))  # any order
        assert read_in_another_process(buffer, layout) == pytest.approx({n: 2 * v for n, v in expected.items()})
        # the bytes are exactly one flattened bucket's (what a collective update broadcasts)
        assert torch.equal(open_shared_buffer(buffer.describe()), flatten_bucket(layout, doubled, torch.device("cpu")))
    finally:
        path = buffer.describe()["path"]
        buffer.close()
    with pytest.raises(WeightTransportError, match="missing or shorter"):
        open_shared_buffer({"kind": "file", "id": "x", "nbytes": 8, "path": path})


def test_a_dead_trainers_buffer_file_is_removed_by_the_next_buffer(tmp_path, monkeypatch) -> None:
    """Only files of this PID namespace whose pid no process has: a live trainer's file, and one
    of another namespace (a container sharing /dev/shm, where the pid means another process), stay."""
    import areal_tasks.weights.shared_buffer as shared

    monkeypatch.setattr(shared, "_shm_dir", lambda: tmp_path)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()  # a pid that has exited
    namespace = shared._pid_namespace()
    orphan = tmp_path / f"areal-weights-{namespace}-{dead}-0123abcd"
    alive = tmp_path / f"areal-weights-{namespace}-{os.getppid()}-4567ef01"  # the test runner's parent
    elsewhere = tmp_path / f"areal-weights-{namespace}1-{dead}-89ab2345"  # another container's trainer
    for path in (orphan, alive, elsewhere):
        path.write_bytes(b"x" * 16)
    buffer = SharedWeightBuffer(8, torch.device("cpu"))
    try:
        assert not orphan.exists() and alive.exists() and elsewhere.exists()
        assert Path(buffer.describe()["path"]).name.startswith(f"areal-weights-{namespace}-{os.getpid()}-")
        assert Path(buffer.describe()["path"]).parent == tmp_path
    finally:
        buffer.close()


def test_packing_in_small_groups_gives_the_same_bytes(monkeypatch) -> None:
    import areal_tasks.weights.shared_buffer as shared

    named = tensors()
    layout = shared_layout([spec_of(n, t) for n, t in named.items()])
    monkeypatch.setattr(shared, "PACK_GROUP_BYTES", 1)  # a copy per tensor: a stream of gathered shards
    buffer = SharedWeightBuffer(sum(s.nbytes for s in layout), torch.device("cpu"))
    try:
        buffer.pack(layout, named.items())
        assert torch.equal(open_shared_buffer(buffer.describe()), flatten_bucket(layout, named, torch.device("cpu")))
    finally:
        buffer.close()


def test_pack_refuses_tensors_that_do_not_match_the_layout() -> None:
    named = tensors()
    layout = shared_layout([spec_of(n, t) for n, t in named.items()])
    buffer = SharedWeightBuffer(sum(s.nbytes for s in layout), torch.device("cpu"))
    try:
        with pytest.raises(WeightTransportError, match=r"lack 1 tensors of the layout, e.g. \['steps'\]"):
            buffer.pack(layout, ((k, v) for k, v in named.items() if k != "steps"))
        with pytest.raises(WeightTransportError, match="the bucket plan says"):
            buffer.pack(layout, {**named, "head.weight": torch.zeros(4, 5)}.items())
        with pytest.raises(WeightTransportError, match="'extra' is not in the shared buffer's layout"):
            buffer.pack(layout, [*named.items(), ("extra", torch.zeros(1))])
        with pytest.raises(WeightTransportError, match="the layout holds .* bytes, the shared buffer"):
            buffer.pack(layout[1:], named.items())
    finally:
        buffer.close()


@pytest.mark.parametrize(
    ("description", "message"),
    [
        ({"kind": "file", "nbytes": 0, "path": "/x"}, "'nbytes' must be a positive int"),
        ({"kind": "file", "nbytes": 8, "path": "/nonexistent/areal-buffer"}, "missing or shorter than 8 bytes"),
        ({"kind": "smoke-signal", "nbytes": 8}, "unknown kind 'smoke-signal'"),
        ({"kind": "cuda_ipc", "nbytes": 8}, "cannot open shared weight buffer"),
    ],
)
def test_bad_descriptions_are_refused_by_name(description: dict, message: str) -> None:
    with pytest.raises(WeightTransportError, match=message):
        open_shared_buffer(description)


def test_pick_buffer_on_cpu() -> None:
    file = {"kind": "file", "id": "a", "nbytes": 8, "path": "/dev/shm/a"}
    gpu = {"kind": "cuda_ipc", "id": "b", "nbytes": 8, "gpu_uuid": "GPU-1"}
    assert pick_buffer([gpu, file], torch.device("cpu")) == file
    with pytest.raises(WeightTransportError, match="names no buffer"):
        pick_buffer([], torch.device("cpu"))
    with pytest.raises(WeightTransportError, match="a CPU server cannot read them"):
        pick_buffer([gpu], torch.device("cpu"))


def test_shared_meta_round_trips_and_rejects_bad_buffers() -> None:
    described = {"kind": "file", "id": "a", "nbytes": 8, "path": "/dev/shm/a"}
    meta = WeightUpdateMeta.shared(3).with_buffers((described,))
    wire = json.loads(json.dumps(meta.to_dict()))
    assert WeightUpdateMeta.from_dict(wire) == meta and meta.shared_buffers == (described,)
    assert WeightUpdateMeta.shared(3).shared_buffers == ()  # the trainer's side, before packing
    with pytest.raises(ConfigError, match="only a shared update names buffers"):
        WeightUpdateMeta.disk("/tmp/w", 1).with_buffers((described,))
    with pytest.raises(ConfigError, match="each with a 'kind'"):
        WeightUpdateMeta.shared(1, ({"nbytes": 8},))
    with pytest.raises(ConfigError, match="type: must be 'disk', 'collective' or 'shared'"):
        WeightUpdateMeta(type="tape", version=1)  # type: ignore[arg-type]
