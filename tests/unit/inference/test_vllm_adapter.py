"""The vLLM adapter builds OpenAI-completions bodies and RL-endpoint calls, and parses answers strictly.

(That every field name exists in vLLM 0.32 is checked against the installed vLLM in
``tests/integration/vllm/test_vllm_wire.py``.)
"""

from __future__ import annotations

import pytest

from areal_tasks.api.inference import ParamSpec, SamplingParams
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.client import GenerateInput, make_adapter

ADAPTER = make_adapter("vllm", model="tiny")
INP = GenerateInput("r-0001", [5, 6], SamplingParams(max_new_tokens=3))


def answer(token_ids, finish="length", logprobs=None, tokens=None):
    logprobs = [-0.5] * len(token_ids) if logprobs is None else logprobs
    tokens = [f"token_id:{t}" for t in token_ids] if tokens is None else tokens
    return {
        "choices": [
            {
                "index": 0,
                "text": "x",
                "finish_reason": finish,
                "token_ids": token_ids,
                "logprobs": {"tokens": tokens, "token_logprobs": logprobs},
            }
        ]
    }


def test_generate_body_has_token_prompt_logprobs_and_every_sampling_field() -> None:
    sampling = SamplingParams(
        max_new_tokens=7,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        stop=("</s>",),
        stop_token_ids=(2,),
        ignore_eos=True,
        seed=11,
    )
    call = ADAPTER.generate(GenerateInput("r-0002", [5, 6], sampling))
    assert (call.method, call.path) == ("POST", "/v1/completions")
    assert call.json == {
        "model": "tiny",
        "prompt": [5, 6],
        "request_id": "r-0002",
        "stream": False,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "max_tokens": 7,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "ignore_eos": True,
        "stop": ["</s>"],
        "stop_token_ids": [2],
        "seed": 11,
    }
    assert "model" not in make_adapter("vllm").generate(INP).json
    assert "seed" not in ADAPTER.generate(INP).json


@pytest.mark.parametrize(
    ("finish", "expected"), [("length", "length"), ("stop", "stop"), ("abort", "abort"), ("repetition", "stop")]
)
def test_parse_maps_finish_reasons(finish: str, expected: str) -> None:
    out = ADAPTER.parse_generate(answer([7, 8], finish, logprobs=[-0.25, -1.5]), INP)
    assert (out.output_ids, out.output_logprobs, out.stop_reason) == ([7, 8], [-0.25, -1.5], expected)
    assert out.versions is None and out.error is None


def test_an_abort_with_no_tokens_yet_is_empty() -> None:
    out = ADAPTER.parse_generate(answer([], "abort"), INP)
    assert (out.output_ids, out.output_logprobs, out.stop_reason) == ([], [], "abort")


@pytest.mark.parametrize(
    "payload",
    [
        {"error": {"message": "bad"}},
        answer([7], finish="error"),
        answer([7, 8], logprobs=[-0.5]),
        answer([7, 8], tokens=["token_id:7", "token_id:9"]),
        answer([7], tokens=["hello"]),
        answer([7], logprobs=[None]),
    ],
    ids=["no-choices", "unknown-finish", "short-logprobs", "other-tokens", "text-token", "null-logprob"],
)
def test_parse_refuses_malformed_answers(payload: dict) -> None:
    with pytest.raises(InferenceRequestError):
        ADAPTER.parse_generate(payload, INP)


def test_control_calls() -> None:
    assert ADAPTER.pause("abort").params == {"mode": "abort"}
    assert ADAPTER.pause("in_place").params == ADAPTER.pause("retract").params == {"mode": "keep"}
    assert (ADAPTER.resume().method, ADAPTER.resume().path) == ("POST", "/resume")
    assert ADAPTER.model_info().path == "/weight_info"
    assert [ADAPTER.parse_version(p) for p in ({"weight_version": "4"}, {"weight_version": None}, [])] == [
        4,
        None,
        None,
    ]


def test_a_disk_update_is_start_update_finish() -> None:
    meta = WeightUpdateMeta.disk("/w/v3", 3)
    calls = [ADAPTER.begin_weight_update(meta), ADAPTER.update_weights_from_disk(meta), ADAPTER.end_weight_update(meta)]
    assert [c.path for c in calls] == ["/start_weight_update", "/update_weights", "/finish_weight_update"]
    assert calls[1].json == {"update_info": {"path": "/w/v3"}}
    assert calls[2].json == {"weight_version": "3"}


def test_a_collective_update_joins_once_and_sends_buckets() -> None:
    meta = WeightUpdateMeta.collective(5, "10.0.0.1", 29500, 3, group_name="g", timeout_s=30.0)
    init = ADAPTER.init_weight_group(meta, rank_offset=2)
    assert init.path == "/init_weight_transfer_engine"
    assert init.json == {
        "init_info": {
            "master_address": "10.0.0.1",
            "master_port": 29500,
            "rank_offset": 2,
            "world_size": 3,
            "group_name": "g",
            "backend": "gloo",
            "timeout_s": 30.0,
        }
    }
    bucket = [ParamSpec("a.weight", "float32", (2, 3)), ParamSpec("b.bias", "bfloat16", (4,))]
    call = ADAPTER.update_weights_from_distributed(meta, bucket)
    assert call.json == {
        "update_info": {
            "names": ["a.weight", "b.bias"],
            "dtype_names": ["float32", "bfloat16"],
            "shapes": [[2, 3], [4]],
        }
    }
