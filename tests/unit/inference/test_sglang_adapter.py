"""The SGLang adapter builds bodies with SGLang's own field names and parses its answers strictly."""

from __future__ import annotations

import pytest
from fake_sglang import DISK_KEYS, DIST_KEYS, GROUP_KEYS, SGLANG_SAMPLING_KEYS

from areal_tasks.api.inference import ParamSpec, SamplingParams
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import ConfigError, InferenceRequestError
from areal_tasks.inference.client import GenerateInput, make_adapter
from areal_tasks.inference.registry import inference_backend_names

ADAPTER = make_adapter("sglang")
INP = GenerateInput("abc-0000", [1, 2, 3], SamplingParams(max_new_tokens=4))


def answer(output_ids, finish, **meta):
    logprobs = meta.pop("logprobs", [[-0.5, t, None] for t in output_ids])
    return {
        "text": "x",
        "output_ids": output_ids,
        "meta_info": {
            "id": "abc-0000",
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": len(output_ids),
            "output_token_logprobs": logprobs,
            **meta,
        },
    }


def test_generate_body_uses_sglang_names() -> None:
    sampling = SamplingParams(
        max_new_tokens=7,
        temperature=0.7,
        top_p=0.9,
        top_k=-1,
        stop=("</s>",),
        stop_token_ids=(2,),
        ignore_eos=True,
        seed=11,
    )
    call = ADAPTER.generate(GenerateInput("r-0001", [5, 6], sampling))
    assert (call.method, call.path) == ("POST", "/generate")
    assert call.json == {
        "rid": "r-0001",
        "input_ids": [5, 6],
        "return_logprob": True,
        "stream": False,
        "sampling_params": {
            "max_new_tokens": 7,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "ignore_eos": True,
            "stop": ["</s>"],
            "stop_token_ids": [2],
            "sampling_seed": 11,
        },
    }
    assert set(call.json["sampling_params"]) <= SGLANG_SAMPLING_KEYS


def test_empty_stop_lists_and_no_seed_are_left_out() -> None:
    params = ADAPTER.generate(INP).json["sampling_params"]
    assert "stop" not in params and "stop_token_ids" not in params and "sampling_seed" not in params


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        ({"type": "stop", "matched": 9}, "stop"),
        ({"type": "length", "length": 2}, "length"),
        ({"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}, "abort"),
    ],
)
def test_finish_reasons(finish, reason) -> None:
    out = ADAPTER.parse_generate(answer([7, 9], finish), INP)
    assert out.stop_reason == reason and out.output_ids == [7, 9] and out.output_logprobs == [-0.5, -0.5]
    assert out.error is None


def test_abort_with_error_status_carries_the_message() -> None:
    finish = {"type": "abort", "message": "too long", "status_code": 400, "err_type": "BadRequestError"}
    out = ADAPTER.parse_generate(answer([], finish), INP)
    assert out.stop_reason == "abort" and "too long" in out.error and "400" in out.error


def test_weight_version_spans_give_per_token_versions() -> None:
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}]
    out = ADAPTER.parse_generate(answer([1, 2, 3], {"type": "length"}, weight_version="4", weight_versions=spans), INP)
    assert out.versions == [3, 3, 4]


def test_weight_version_without_spans_and_default_version() -> None:
    assert ADAPTER.parse_generate(answer([1, 2], {"type": "length"}, weight_version="5"), INP).versions == [5, 5]
    assert ADAPTER.parse_generate(answer([1, 2], {"type": "length"}, weight_version="default"), INP).versions is None


def test_first_token_latency_is_read() -> None:
    out = ADAPTER.parse_generate(answer([1], {"type": "length"}, first_token_latency=0.25), INP)
    assert out.first_token_latency_s == 0.25


@pytest.mark.parametrize(
    "payload",
    [
        {"text": "no meta"},
        answer([1], {"type": "weird"}),
        answer([1, 2], {"type": "length"}, logprobs=[[-0.1, 1, None]]),
        answer([1, 2], {"type": "length"}, logprobs=[[-0.1, 1, None], [-0.1, 3, None]]),
        answer([1], {"type": "length"}, logprobs=[[None, 1, None]]),
    ],
    ids=["no-meta", "unknown-finish", "short-logprobs", "token-mismatch", "null-logprob"],
)
def test_malformed_answers_are_errors(payload) -> None:
    with pytest.raises(InferenceRequestError):
        ADAPTER.parse_generate(payload, INP)


def test_control_bodies_use_sglang_fields() -> None:
    disk = ADAPTER.update_weights_from_disk(WeightUpdateMeta.disk("/w/v3", 3))
    assert disk.path == "/update_weights_from_disk" and set(disk.json) <= DISK_KEYS
    assert disk.json["model_path"] == "/w/v3" and disk.json["weight_version"] == "3"
    meta = WeightUpdateMeta.collective(2, "10.0.0.1", 29500, 3, group_name="g", backend="nccl")
    init = ADAPTER.init_weight_group(meta, rank_offset=2)
    assert init.json == {
        "master_address": "10.0.0.1",
        "master_port": 29500,
        "rank_offset": 2,
        "world_size": 3,
        "group_name": "g",
        "backend": "nccl",
    }
    assert set(init.json) == GROUP_KEYS
    bucket = [ParamSpec("w", "bfloat16", (2, 3)), ParamSpec("b", "float32", (3,))]
    dist = ADAPTER.update_weights_from_distributed(meta, bucket)
    assert set(dist.json) <= DIST_KEYS
    assert (dist.json["names"], dist.json["dtypes"], dist.json["shapes"]) == (
        ["w", "b"],
        ["bfloat16", "float32"],
        [[2, 3], [3]],
    )
    assert dist.json["load_format"] == "flattened_bucket" and dist.json["group_name"] == "g"
    assert ADAPTER.pause("retract").json == {"mode": "retract"}
    assert ADAPTER.resume().path == "/continue_generation"
    assert (ADAPTER.health().method, ADAPTER.health().path) == ("GET", "/health")
    assert ADAPTER.parse_version({"weight_version": "12"}) == 12


def test_control_error_judgement() -> None:
    call = ADAPTER.resume()
    assert ADAPTER.control_error(call, 200, {"status": "ok"}) is None
    assert "boom" in ADAPTER.control_error(call, 200, {"success": False, "message": "boom"})
    assert "HTTP 503" in ADAPTER.control_error(call, 503, "")


def test_registry() -> None:
    assert {"sglang", "embedded", "vllm"} <= set(inference_backend_names())
    assert make_adapter("embedded").name == "embedded"
    with pytest.raises(ConfigError, match=r"unknown inference backend 'tgi'; known: embedded, sglang, vllm"):
        make_adapter("tgi")
