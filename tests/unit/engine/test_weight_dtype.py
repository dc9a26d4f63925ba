"""Published weights travel in the engine's compute dtype, not in the fp32 of the master weights.

FSDP keeps fp32 master weights and computes in ``compute_dtype_name(config.dtype, device)`` (bf16
on GPU by default). ``weight_specs`` (the bucket plan the client posts to the servers) and the
tensors ``send_weights`` broadcasts or writes must both use that dtype, so plan and bytes agree and
a bf16 server receives half the bytes of fp32. Integer tensors are never cast; on CPU with
``dtype: auto`` nothing changes. The engine here is a stand-in with the attributes the sender reads
(a plain HF model, its config and device), so no process group or FSDP wrap is needed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from areal_tasks.api.inference import plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.engine.fsdp import weight_sender
from areal_tasks.engine.fsdp.weight_sender import cast_floating, publish_dtype, send_weights, weight_specs
from areal_tasks.engine.weights.collective import WeightGroup


def _engine(model: torch.nn.Module | None, dtype: str, device: str = "cpu", model_path: str | None = None):
    engine = SimpleNamespace(
        model=model,
        config=SimpleNamespace(dtype=dtype),
        device=torch.device(device),
        role="actor",
        model_path=model_path,
        weight_groups={},
        staged_weights=None,
    )
    engine.weight_specs = lambda: weight_specs(engine)  # FSDPEngine keeps this list; here it is recomputed
    return engine


@pytest.fixture
def fp32_model(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, torch_dtype=torch.float32)


@pytest.fixture
def single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(torch.distributed, "barrier", lambda group=None: None)


@pytest.mark.parametrize(
    ("dtype", "device", "expected"),
    [
        ("auto", "cpu", torch.float32),
        ("auto", "cuda", torch.bfloat16),
        ("bfloat16", "cpu", torch.bfloat16),
        ("float16", "cpu", torch.float16),
        ("float32", "cuda", torch.float32),
    ],
)
def test_publish_dtype_is_the_compute_dtype(dtype: str, device: str, expected: torch.dtype) -> None:
    assert publish_dtype(_engine(None, dtype, device)) == expected


def test_cast_floating_casts_only_floating_tensors() -> None:
    named = [
        ("w", torch.ones(2)),
        ("i", torch.arange(3)),
        ("b", torch.ones(1, dtype=torch.bool)),
        ("m", torch.empty(4, 2, device="meta")),
    ]
    out = dict(cast_floating(named, torch.bfloat16))
    assert out["w"].dtype == torch.bfloat16 and out["m"].dtype == torch.bfloat16 and out["m"].shape == (4, 2)
    assert out["i"].dtype == torch.int64 and out["b"].dtype == torch.bool


def test_specs_follow_the_compute_dtype(fp32_model) -> None:
    fp32 = weight_specs(_engine(fp32_model, "auto"))  # CPU default: unchanged
    bf16 = weight_specs(_engine(fp32_model, "bfloat16"))
    assert {s.dtype for s in fp32} == {"float32"}
    assert {s.dtype for s in bf16} == {"bfloat16"}
    assert [(s.name, s.shape) for s in bf16] == [(s.name, s.shape) for s in fp32]
    assert sum(s.nbytes for s in bf16) * 2 == sum(s.nbytes for s in fp32)


def test_collective_sends_the_planned_compute_dtype_bytes(fp32_model, single_rank, monkeypatch) -> None:
    engine = _engine(fp32_model, "bfloat16")
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(torch.distributed, "broadcast", lambda t, src, group=None: sent.append(t.clone()))
    monkeypatch.setattr(weight_sender, "_group", lambda e, m: WeightGroup("g", 2, "gloo", torch.device("cpu"), None))
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29999, 2, bucket_bytes=4096)
    send_weights(engine, meta)
    specs = weight_specs(engine)
    buckets = plan_weight_buckets(specs, meta.bucket_bytes)  # what the client posts to the servers
    assert [t.numel() for t in sent] == [sum(s.nbytes for s in b) for b in buckets]
    names = {s.name for s in specs}  # all bf16: the plan keeps the state-dict order
    expected = torch.cat(
        [t.to(torch.bfloat16).reshape(-1).view(torch.uint8) for n, t in fp32_model.state_dict().items() if n in names]
    )
    assert torch.equal(torch.cat(sent), expected)


@pytest.mark.parametrize("staged_version", [1, 7])
def test_weights_staged_before_the_pause_are_the_bytes_sent(
    fp32_model, single_rank, monkeypatch, staged_version: int
) -> None:
    """``stage_weights`` packs a one-bucket update ahead; ``send_weights`` then only broadcasts it.
    A stage for another version is dropped and the weights are gathered afresh (same bytes)."""
    from areal_tasks.engine.fsdp import export
    from areal_tasks.engine.fsdp.weight_sender import stage_weights

    engine = _engine(fp32_model, "bfloat16")
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(torch.distributed, "broadcast", lambda t, src, group=None: sent.append(t.clone()))
    monkeypatch.setattr(weight_sender, "_group", lambda e, m: WeightGroup("g", 2, "gloo", torch.device("cpu"), None))
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29999, 2, backend="gloo")
    stage_weights(engine, WeightUpdateMeta.collective(staged_version, "127.0.0.1", 29999, 2, backend="gloo"))
    assert engine.staged_weights is not None and engine.staged_weights.flat is not None
    gathers: list[int] = []
    real_iter = export.iter_hf_tensors
    monkeypatch.setattr(export, "iter_hf_tensors", lambda *a, **kw: gathers.append(1) or real_iter(*a, **kw))
    send_weights(engine, meta)
    assert engine.staged_weights is None
    assert gathers == ([] if staged_version == 1 else [1])
    names = {s.name for s in weight_specs(engine)}
    expected = torch.cat(
        [t.to(torch.bfloat16).reshape(-1).view(torch.uint8) for n, t in fp32_model.state_dict().items() if n in names]
    )
    assert len(sent) == 1 and torch.equal(sent[0], expected)


def test_nothing_is_staged_when_the_weights_need_several_buckets(fp32_model, single_rank) -> None:
    from areal_tasks.engine.fsdp.weight_sender import stage_weights

    engine = _engine(fp32_model, "bfloat16")
    stage_weights(engine, WeightUpdateMeta.collective(1, "127.0.0.1", 29999, 2, backend="gloo", bucket_bytes=4096))
    assert engine.staged_weights is None


def test_disk_writes_the_compute_dtype(fp32_model, tiny_qwen2, single_rank, tmp_path) -> None:
    from areal_tasks.models.safetensors_dir import read_safetensors_dir

    send_weights(
        _engine(fp32_model, "bfloat16", model_path=str(tiny_qwen2)), WeightUpdateMeta.disk(str(tmp_path / "v1"), 1)
    )
    written = read_safetensors_dir(tmp_path / "v1")
    assert written and {t.dtype for t in written.values()} == {torch.bfloat16}
    assert (tmp_path / "v1" / "config.json").is_file()


def test_a_one_device_mesh_publishes_its_local_tensors_without_a_gather(tiny_qwen2, monkeypatch) -> None:
    """A DTensor on a mesh of one device is taken as its local tensor: ``full_tensor`` (DTensor's
    redistribution, most of a one-GPU update's host time) is never called, and the bytes agree."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from areal_tasks.engine.fsdp.export import iter_full_tensors

    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen2, torch_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, torch_dtype=torch.float32)
    owned = not dist.is_initialized()
    if owned:
        from areal_tasks.launch.ports import PortAllocator

        monkeypatch.setitem(os.environ, "MASTER_ADDR", "127.0.0.1")
        monkeypatch.setitem(os.environ, "MASTER_PORT", str(PortAllocator().allocate(1)[0]))
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        monkeypatch.setattr(DTensor, "full_tensor", lambda self, **kw: pytest.fail("gathered a one-device DTensor"))
        published = dict(iter_full_tensors(model, torch.device("cpu")))
        expected = reference.state_dict()
        assert published.keys() == expected.keys()
        for name, tensor in expected.items():
            assert not isinstance(published[name], DTensor) and torch.equal(published[name], tensor), name
    finally:
        if owned:
            dist.destroy_process_group()
