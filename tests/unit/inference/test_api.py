"""Wire types of the InferenceEngine API: validation, round trips, and the weight bucket plan."""

from __future__ import annotations

import pytest

from areal_tasks.api.inference import ModelRequest, ModelResponse, ParamSpec, SamplingParams, plan_weight_buckets
from areal_tasks.config.rollout import SamplingConfig
from areal_tasks.errors import ConfigError


def test_sampling_params_from_config_and_validation() -> None:
    params = SamplingParams.from_config(SamplingConfig(temperature=0.5, max_new_tokens=9, stop=["x"], seed=3))
    assert (params.temperature, params.max_new_tokens, params.stop, params.seed) == (0.5, 9, ("x",), 3)
    assert params.with_max_new_tokens(2).max_new_tokens == 2
    with pytest.raises(ConfigError, match="top_p=0"):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError, match="max_new_tokens=0"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ConfigError, match="top_k=0"):
        SamplingParams(top_k=0)


def test_request_needs_token_ids() -> None:
    assert len(ModelRequest([1]).rid) == 32
    with pytest.raises(ConfigError, match="must not be empty"):
        ModelRequest([])
    with pytest.raises(ConfigError, match="non-negative"):
        ModelRequest([1, -2])


def test_response_round_trip_and_alignment() -> None:
    resp = ModelResponse("r", [1], [2, 3], [-0.1, -0.2], [0, 1], "length", 0.1, 0.2, n_resubmits=1, server="s")
    assert ModelResponse.from_dict(resp.to_dict()) == resp and resp.output_len == 2
    with pytest.raises(ConfigError, match="same length"):
        ModelResponse("r", [1], [2, 3], [-0.1], [0, 1], "stop", 0.0, 0.0)


def test_bucket_plan_respects_size_order_and_alignment() -> None:
    specs = [
        ParamSpec("a", "bfloat16", (3,)),
        ParamSpec("b", "float32", (2,)),
        ParamSpec("c", "float32", (100,)),
        ParamSpec("d", "int8", (1,)),
        ParamSpec("e", "float64", (1,)),
    ]
    buckets = plan_weight_buckets(specs, bucket_bytes=16)
    assert [[p.name for p in b] for b in buckets] == [["b", "a"], ["c"], ["e", "d"]]
    for bucket in buckets:
        offset = 0
        for p in bucket:
            assert offset % p.itemsize == 0
            offset += p.nbytes
    assert sorted(p.name for b in buckets for p in b) == sorted(p.name for p in specs)
    assert ParamSpec("x", "bfloat16", [2, 3]).nbytes == 12
    with pytest.raises(ConfigError, match="dtype"):
        ParamSpec("x", "complex32", (1,))
    with pytest.raises(ConfigError, match="bucket_bytes"):
        plan_weight_buckets(specs, 0)
