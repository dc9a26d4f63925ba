"""Published weights travel in the engine's compute dtype, not in the fp32 of the master weights.

FSDP keeps fp32 master weights and computes in ``compute_dtype_name(config.dtype, device)`` (bf16
on GPU by default). ``weight_specs`` (the bucket plan the client posts to the servers) and the
tensors a transport broadcasts or writes from ``iter_weights`` must both use that dtype, so plan
and bytes agree and a bf16 server receives half the bytes of fp32. Integer tensors are never cast;
on CPU with ``dtype: auto`` nothing changes. The source here is a stand-in with what
``engine/fsdp/weight_source.py`` reads of an engine (a plain HF model, its config and device), so
no process group or FSDP wrap is needed; the transports are the real ones. Also: the specs (from
meta tensors) match the tensors published for plain, tied and LoRA models.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from areal_tasks.api.inference import plan_weight_buckets
from areal_tasks.api.train_engine import ParallelInfo
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.api.weights import WeightSource
from areal_tasks.engine.fsdp import weight_source
from areal_tasks.engine.fsdp.weight_source import cast_floating, publish_dtype, weight_specs
from areal_tasks.weights import collective
from areal_tasks.weights.base import PublishContext
from areal_tasks.weights.buckets import spec_of
from areal_tasks.weights.collective import CollectiveTransport
from areal_tasks.weights.disk import DiskTransport
from areal_tasks.weights.group import WeightGroup


class HFSource:
    """What ``FSDPEngine`` offers a transport, over a plain HF model on one rank."""

    def __init__(self, model: torch.nn.Module | None, dtype: str, device: str = "cpu", model_path: str | None = None):
        self.model = model
        self.config = SimpleNamespace(dtype=dtype)
        self.device = torch.device(device)
        self.role = "actor"
        self.model_path = model_path
        self.parallel = ParallelInfo(world_size=1, rank=0, dp_size=1, dp_rank=0)

    def weight_specs(self):  # FSDPEngine keeps this list; here it is recomputed
        return weight_specs(self)

    def iter_weights(self):
        return weight_source.iter_weights(self)

    def hf_config(self):
        return self.model.config


def _engine(model: torch.nn.Module | None, dtype: str, device: str = "cpu", model_path: str | None = None) -> HFSource:
    source = HFSource(model, dtype, device, model_path)
    assert isinstance(source, WeightSource)
    return source


@pytest.fixture
def joined(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collective transport's group join, without a rendezvous (broadcasts are captured)."""
    monkeypatch.setattr(
        collective, "join_as_trainer", lambda meta, device: WeightGroup("g", 0, 2, "gloo", torch.device("cpu"), None)
    )


@pytest.fixture
def fp32_model(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, torch_dtype=torch.float32)


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


def test_collective_sends_the_planned_compute_dtype_bytes(fp32_model, joined, monkeypatch, tmp_path) -> None:
    engine = _engine(fp32_model, "bfloat16")
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(torch.distributed, "broadcast", lambda t, src, group=None: sent.append(t.clone()))
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29999, 2, bucket_bytes=4096)
    CollectiveTransport(engine, PublishContext(tmp_path)).send(meta)
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
    fp32_model, joined, monkeypatch, tmp_path, staged_version: int
) -> None:
    """``prepare`` packs a one-bucket update ahead; ``send`` then only broadcasts it. A stage for
    another version is dropped and the weights are gathered afresh (same bytes)."""
    from areal_tasks.engine.fsdp import export

    engine = _engine(fp32_model, "bfloat16")
    transport = CollectiveTransport(engine, PublishContext(tmp_path))
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(torch.distributed, "broadcast", lambda t, src, group=None: sent.append(t.clone()))
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29999, 2, backend="gloo")
    parts = transport.prepare(WeightUpdateMeta.collective(staged_version, "127.0.0.1", 29999, 2, backend="gloo"))
    assert set(parts) == {"perf/weight_pack_s"} and parts["perf/weight_pack_s"] > 0
    assert transport._staged is not None and transport._staged.flat is not None
    gathers: list[int] = []
    real_iter = export.iter_hf_tensors
    monkeypatch.setattr(export, "iter_hf_tensors", lambda *a, **kw: gathers.append(1) or real_iter(*a, **kw))
    transport.send(meta)
    assert transport._staged is None
    assert gathers == ([] if staged_version == 1 else [1])
    names = {s.name for s in weight_specs(engine)}
    expected = torch.cat(
        [t.to(torch.bfloat16).reshape(-1).view(torch.uint8) for n, t in fp32_model.state_dict().items() if n in names]
    )
    assert len(sent) == 1 and torch.equal(sent[0], expected)


def test_nothing_is_staged_when_the_weights_need_several_buckets(fp32_model, tmp_path) -> None:
    transport = CollectiveTransport(_engine(fp32_model, "bfloat16"), PublishContext(tmp_path))
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", 29999, 2, backend="gloo", bucket_bytes=4096)
    assert transport.prepare(meta) == {"perf/weight_pack_s": 0.0}
    assert transport._staged is None


def test_disk_writes_the_compute_dtype(fp32_model, tiny_qwen2, tmp_path) -> None:
    from areal_tasks.models.safetensors_dir import read_safetensors_dir

    transport = DiskTransport(_engine(fp32_model, "bfloat16", model_path=str(tiny_qwen2)), PublishContext(tmp_path))
    transport.send(WeightUpdateMeta.disk(str(tmp_path / "v1"), 1))
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


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_weight_specs_match_the_published_tensors(tiny_qwen2, lora: bool, tied: bool) -> None:
    from transformers import AutoModelForCausalLM

    from areal_tasks.config.engine import LoRAConfig
    from areal_tasks.engine.fsdp.export import iter_hf_meta, iter_hf_tensors
    from areal_tasks.models.lora import apply_lora

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2, torch_dtype=torch.float32, tie_word_embeddings=tied)
    if lora:
        model = apply_lora(model, LoRAConfig(enabled=True, rank=4, alpha=8, target_modules=["q_proj", "up_proj"]), 1)
    published = [spec_of(n, t) for n, t in iter_hf_tensors(model, torch.device("cpu"))]
    assert [spec_of(n, t) for n, t in iter_hf_meta(model)] == published
    names = [s.name for s in published]
    assert ("lm_head.weight" in names) is not tied
    assert not any("lora" in n or "base_layer" in n for n in names)
