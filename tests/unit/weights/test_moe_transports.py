"""Every transport delivers a MoE update in the checkpoint's per-expert names to the embedded server.

The archon engine publishes HF's on-disk names (one tensor per expert: qwen3_moe's
``mlp.experts.E.{gate,up,down}_proj.weight``, mixtral's ``block_sparse_moe.experts.E.w1/w3/w2``),
while the embedded server's transformers 5 model holds the experts stacked
(``mlp.experts.gate_up_proj``/``down_proj``). Here a kit tiny model's checkpoint is published as it
is stored, through each transport, to a server process whose served model is ``from_pretrained`` of
that checkpoint: the server ends with exactly ``from_pretrained``'s tensors (every expert, in the
served names), and the collective buckets are small enough to split a layer's experts. An update
that lacks an expert is refused by every transport, naming the missing one. (Before, the shared and
collective receivers refused every such update: the per-expert names are not the served model's.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from areal_tasks.api.inference import plan_weight_buckets
from areal_tasks.models import build_tiny_model
from areal_tasks.weights.base import PublishContext
from areal_tasks.weights.registry import transport_class

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from transport_harness import CheckpointSource, publish  # noqa: E402

pytestmark = pytest.mark.timeout(300)

MODES = ("disk", "shared", "collective")
FAMILIES = ("qwen3_moe", "mixtral")
#: small enough that a layer's experts span several buckets of the tiny models
BUCKET_BYTES = 40_000


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request: pytest.FixtureRequest) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny MoE checkpoint and the tensors ``from_pretrained`` makes of it (parameters, served names)."""
    from transformers import AutoModelForCausalLM

    model_dir = Path(build_tiny_model(request.param))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model_dir, {n: p.detach().clone() for n, p in model.named_parameters()}


def _served(expected: dict[str, torch.Tensor]) -> dict[str, list]:
    return {n: [list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in expected.items()}


def _update(mode: str, source: CheckpointSource, tmp_path: Path, served: dict) -> dict:
    transport = transport_class(mode)(source, PublishContext(tmp_path / "weights", n_servers=1))
    try:
        return publish(transport, 1, tmp_path, served, bucket_bytes=BUCKET_BYTES)
    finally:
        transport.close()


def test_the_buckets_split_a_layers_experts(checkpoint: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """The premise of the collective case: some bucket holds only some experts of a layer."""
    source = CheckpointSource(checkpoint[0])
    expert = re.compile(r"^(.+\.experts)\.(\d+)\.")
    split = False
    for bucket in plan_weight_buckets(source.weight_specs(), BUCKET_BYTES):
        layers: dict[str, set[int]] = {}
        for spec in bucket:
            if m := expert.match(spec.name):
                layers.setdefault(m[1], set()).add(int(m[2]))
        split |= any(len(experts) < 4 for experts in layers.values())
    assert split


@pytest.mark.parametrize("mode", MODES)
def test_a_per_expert_update_gives_the_server_from_pretrained_weights(
    mode: str, checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    model_dir, expected = checkpoint
    source = CheckpointSource(model_dir)
    assert any(".experts.0." in n for n in source.tensors)  # published in the checkpoint's names
    got = _update(mode, source, tmp_path, _served(expected))
    assert "error" not in got, got.get("error")
    received = got["tensors"]
    assert set(received) == set(expected)
    assert any(n.endswith("experts.gate_up_proj") for n in received)
    for name, tensor in expected.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


@pytest.mark.parametrize("mode", MODES)
def test_an_update_missing_an_expert_is_refused_naming_it(
    mode: str, checkpoint: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    model_dir, expected = checkpoint
    source = CheckpointSource(model_dir, drop=".experts.3.")
    got = _update(mode, source, tmp_path, _served(expected))
    assert "tensors" not in got
    assert re.search(r"served model has 4 experts, the update has \[0, 1, 2\]; missing experts 3 \(", got["error"]), (
        got["error"]
    )
