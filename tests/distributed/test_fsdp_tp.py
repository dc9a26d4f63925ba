"""Tensor parallelism (tp=2 on 2 gloo ranks) matches a single-process transformers reference in
loss, gradients and forward log-probs (fp32, 1e-5) for every family with a plan; other families
get a clear error."""

from __future__ import annotations

import pytest
from engine_helpers import assert_family_results_match_reference
from launch import run_workers

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


@pytest.mark.distributed
def test_tp2_matches_reference(tiny_model_factory, tmp_path):
    dirs = {family: str(tiny_model_factory(family)) for family in FAMILIES}
    run_workers("workers_fsdp:family_grads", 2, tmp_path, {"model_dirs": dirs, "tp": 2})
    assert_family_results_match_reference(tmp_path, dirs)


def test_unsupported_family_or_sizes_are_clear_errors():
    from types import SimpleNamespace

    from areal_tasks.engine.parallel.tensor_parallel import check_tp_compatible
    from areal_tasks.errors import EngineError

    with pytest.raises(EngineError, match="gemma"):
        check_tp_compatible(SimpleNamespace(model_type="gemma"), 2)
    config = SimpleNamespace(model_type="qwen2", num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    check_tp_compatible(config, 2)
    with pytest.raises(EngineError, match="num_key_value_heads"):
        check_tp_compatible(config, 4)


@pytest.mark.distributed
def test_tp2_weight_update_publishes_the_full_weights(tiny_model_factory, tmp_path):
    import torch

    from areal_tasks.models.safetensors_dir import read_safetensors_dir

    run_workers("workers_fsdp:tp_publish", 2, tmp_path, {"model_dir": str(tiny_model_factory("qwen2"))})
    params = torch.load(tmp_path / "result.pt", weights_only=False)["params"]
    published = read_safetensors_dir(tmp_path / "published")
    assert set(published) == set(params)
    for name, tensor in params.items():
        assert published[name].shape == tensor.shape and torch.equal(published[name], tensor), name
