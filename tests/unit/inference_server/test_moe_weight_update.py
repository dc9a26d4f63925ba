"""A collective MoE update in per-expert names, bucket by bucket, through the embedded server's routes.

The archon engine publishes a MoE model's experts one tensor each (HF's on-disk names); the
embedded server's model holds them stacked. On a tiny qwen3_moe engine whose experts were zeroed,
the buckets of the checkpoint (small enough to split a layer's experts) arrive over a loopback
stand-in for the broadcast inside one ``begin_weight_update`` ... ``end_weight_update`` session:
afterwards the served model's weights are ``from_pretrained``'s and the version moved on. An update
whose buckets lack an expert fails at ``end_weight_update``, naming it, and keeps the version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from areal_tasks.api.inference import plan_weight_buckets
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig
from areal_tasks.inference.server.weight_service import WeightService
from areal_tasks.models import build_tiny_model
from areal_tasks.weights.buckets import flatten_bucket, spec_of
from areal_tasks.weights.group import WeightGroup

BUCKET_BYTES = 40_000


@pytest.fixture(scope="module")
def moe_dir() -> Path:
    return Path(build_tiny_model("qwen3_moe"))


@pytest.fixture
def engine(moe_dir: Path, one_thread: None) -> Iterator[Engine]:
    runner = ModelRunner(RunnerConfig(str(moe_dir), device="cpu", max_running_requests=2, context_length=128))
    with torch.no_grad():
        for name, param in runner.model.named_parameters():
            if ".experts." in name:
                param.zero_()
    eng = Engine(runner)
    eng.start()
    yield eng
    eng.shutdown()


def _session(engine: Engine, tensors: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> tuple:
    """Every bucket of ``tensors`` through ``/update_weights_from_distributed`` in one session:
    ``(each bucket's answer, end_weight_update's answer)``."""
    buckets = plan_weight_buckets([spec_of(n, t) for n, t in tensors.items()], BUCKET_BYTES)
    flats = [flatten_bucket(bucket, tensors, torch.device("cpu")) for bucket in buckets]

    def broadcast(tensor: torch.Tensor, src: int, group: object, async_op: bool = False) -> None:
        tensor.copy_(flats.pop(0))

    monkeypatch.setattr(torch.distributed, "broadcast", broadcast)
    svc = WeightService(engine)
    svc.collective.groups["g"] = WeightGroup("g", 1, 2, "gloo", torch.device("cpu"), None)

    async def run() -> tuple:
        assert svc.begin()[0]
        answers = []
        for bucket in buckets:
            answers.append(
                await svc.update_from_distributed(
                    [s.name for s in bucket],
                    [s.dtype for s in bucket],
                    [list(s.shape) for s in bucket],
                    "g",
                    None,
                    False,
                    "flattened_bucket",
                    True,
                )
            )
        return answers, await svc.end()

    try:
        return asyncio.run(run())
    finally:
        svc.collective.groups.clear()  # the loopback group has no process group to leave
        svc.close()


def test_a_per_expert_collective_update_loads_every_expert(
    engine: Engine, moe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    stored = load_file(str(moe_dir / "model.safetensors"))
    version = engine.weight_version
    answers, ended = _session(engine, {n: stored[n] for n in sorted(stored)}, monkeypatch)
    assert all(ok for ok, _ in answers), answers
    assert ended == (True, "Success")
    assert engine.weight_version == str(int(version) + 1)
    expected = AutoModelForCausalLM.from_pretrained(str(moe_dir), dtype=torch.float32).state_dict()
    served = engine.runner.model.state_dict()
    assert any(n.endswith("experts.gate_up_proj") for n in served)
    for name, tensor in expected.items():
        assert torch.equal(served[name].float(), tensor), name


def test_an_update_lacking_an_expert_fails_at_its_end_naming_it(
    engine: Engine, moe_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = load_file(str(moe_dir / "model.safetensors"))
    version = engine.weight_version
    answers, ended = _session(
        engine, {n: stored[n] for n in sorted(stored) if ".layers.1.mlp.experts.2." not in n}, monkeypatch
    )
    assert all(ok for ok, _ in answers), answers
    assert not ended[0]
    assert "model.layers.1.mlp.experts.gate_up_proj: the served model has 4 experts" in ended[1]
    assert "missing experts 2 (gate_proj, up_proj)" in ended[1]
    assert engine.weight_version == version
