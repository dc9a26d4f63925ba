"""Pure pieces of the HTTP layer: SGLang request splitting, version spans, API-key rules, metrics
text, tool-call parsing and the checks of received weights against the served model."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.agent.tool_calls import parse_tool_calls
from areal_tasks.errors import InferenceRequestError, WeightTransportError
from areal_tasks.inference.server.auth import request_allowed
from areal_tasks.inference.server.metrics import render_metrics
from areal_tasks.inference.server.protocol import (
    GenerateReqInput,
    generate_response,
    split_generate,
    weight_version_spans,
)
from areal_tasks.inference.server.request import Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams
from areal_tasks.inference.server.stats import EngineStats
from areal_tasks.weights.base import check_tensors


def _split(**body):
    return split_generate(GenerateReqInput(**body), tokenize=lambda text: [len(text)])


def test_split_single_batch_and_per_item_fields() -> None:
    items, is_batch = _split(input_ids=[1, 2], rid="a", return_logprob=True)
    assert not is_batch and items == [
        {
            "input_ids": [1, 2],
            "sampling_params": {},
            "rid": "a",
            "return_logprob": True,
            "logprob_start_len": -1,
            "top_logprobs_num": 0,
        }
    ]
    items, is_batch = _split(input_ids=[[1], [2, 3]], sampling_params=[{"n": 2}, {}], rid="b")
    assert is_batch and [i["rid"] for i in items] == ["b_0", "b_1"]
    assert [i["sampling_params"] for i in items] == [{"n": 2}, {}]
    items, _ = _split(text=["ab", "cde"], logprob_start_len=0, top_logprobs_num=[0, 20])
    assert [i["input_ids"] for i in items] == [[2], [3]] and items[1]["logprob_start_len"] == 0
    assert [i["top_logprobs_num"] for i in items] == [0, 20]


@pytest.mark.parametrize("top", [21, -1, [1, 30]])
def test_split_refuses_top_logprobs_num_out_of_bounds_by_name(top) -> None:
    count = len(top) if isinstance(top, list) else 1
    with pytest.raises(InferenceRequestError, match="top_logprobs_num must be in 0..20") as refused:
        _split(input_ids=[[1]] * count if count > 1 else [1], top_logprobs_num=top)
    assert refused.value.param == "top_logprobs_num"


def test_top_logprobs_in_sglangs_shape() -> None:
    """SGLang's ``output_top_logprobs`` / ``input_top_logprobs``: per position a list of
    ``[logprob, token_id, text-or-null]``, the first prompt position null."""
    group = SequenceGroup(
        [1, 2, 3], input_logprobs=[None, -1.0, -2.0], input_top_logprobs=[None, [(4, -0.5)], [(5, -0.25)]]
    )
    seq = Sequence(
        rid="r",
        group=group,
        params=SamplingParams(),
        on_finish=lambda s: None,
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=2,
    )
    seq.output_ids, seq.output_logprobs = [7, 8], [-0.1, -0.3]
    seq.output_top_logprobs = [[(7, -0.1), (9, -2.0)], [(6, -0.2), (8, -0.3)]]
    meta = generate_response(seq, "xy")["meta_info"]
    assert meta["output_top_logprobs"] == [[[-0.1, 7, None], [-2.0, 9, None]], [[-0.2, 6, None], [-0.3, 8, None]]]
    assert meta["input_top_logprobs"] == [None, [[-0.5, 4, None]], [[-0.25, 5, None]]]
    texts = generate_response(seq, "xy", decode_token=lambda t: f"<{t}>")["meta_info"]
    assert texts["output_top_logprobs"][0] == [[-0.1, 7, "<7>"], [-2.0, 9, "<9>"]]
    seq.top_logprobs_num = 0  # not asked: SGLang's answer has neither key
    assert "output_top_logprobs" not in generate_response(seq, "xy")["meta_info"]


def test_split_refuses_mismatched_lists_and_unknown_extras_are_ignored() -> None:
    with pytest.raises(InferenceRequestError, match="2 values for 1 prompts"):
        _split(input_ids=[1], return_logprob=[True, False])
    items, _ = _split(input_ids=[1], log_metrics=False, session_id="s")
    assert len(items) == 1


def _seq(events, n_out: int) -> Sequence:
    seq = Sequence(rid="r", group=SequenceGroup([1]), params=SamplingParams(), on_finish=lambda s: None)
    seq.output_ids = list(range(n_out))
    seq.version_events = events
    return seq


def test_weight_version_spans_follow_sglang() -> None:
    assert weight_version_spans(_seq([], 4), "3") == [{"version": "3", "start": 0, "end": 4}]
    spans = weight_version_spans(_seq([("1", 2), ("2", 5)], 7), "3")
    assert spans == [
        {"version": "1", "start": 0, "end": 2},
        {"version": "2", "start": 2, "end": 5},
        {"version": "3", "start": 5, "end": 7},
    ]
    # an update between the same token counts leaves no empty span
    assert weight_version_spans(_seq([("1", 2), ("2", 2)], 3), "3") == [
        {"version": "1", "start": 0, "end": 2},
        {"version": "3", "start": 2, "end": 3},
    ]


@pytest.mark.parametrize(
    "path, header, api_key, admin_key, allowed",
    [
        ("/generate", None, None, None, True),
        ("/pause_generation", None, None, None, False),  # closed without keys (issue #26; SGLang opens it)
        ("/pause_generation", None, None, "adm", False),
        ("/pause_generation", "Bearer adm", None, "adm", True),
        ("/pause_generation", "bearer adm", None, "adm", True),
        ("/pause_generation", "Bearer key", "key", "adm", False),
        ("/pause_generation", "Bearer key", "key", None, True),
        ("/generate", None, "key", None, False),
        ("/generate", "Bearer key", "key", "adm", True),
        ("/generate", None, None, "adm", True),
        ("/health", None, "key", "adm", True),
        ("/metrics", None, "key", "adm", True),
        ("/update_weights_from_distributed", "Token adm", None, "adm", False),
    ],
)
def test_api_key_rules(path, header, api_key, admin_key, allowed) -> None:
    assert request_allowed(path, "POST", header, api_key, admin_key) is allowed


def test_metrics_text_format() -> None:
    stats = EngineStats(
        num_running=3,
        num_waiting=2,
        paused=None,
        draining=True,
        prompt_tokens_total=10,
        generation_tokens_total=20,
        requests_finished_total=4,
        gen_throughput=12.5,
        cache_used_tokens=25,
        cache_capacity_tokens=100,
        weight_version="1",
        decode_steps_total=7,
        decode_seconds_total=0.5,
        decode_wait_seconds_total=0.25,
        prefill_batches_total=3,
        prefill_seconds_total=0.125,
    )
    lines = render_metrics(stats, 'm"x').splitlines()
    assert 'areal:prefill_batches_total{model_name="m\\"x"} 3.0' in lines
    assert 'areal:prefill_seconds_total{model_name="m\\"x"} 0.125' in lines
    assert 'areal:decode_steps_total{model_name="m\\"x"} 7.0' in lines
    assert 'areal:decode_wait_seconds_total{model_name="m\\"x"} 0.25' in lines
    assert 'sglang:num_running_reqs{model_name="m\\"x"} 3.0' in lines
    assert 'sglang:token_usage{model_name="m\\"x"} 0.25' in lines
    assert "# TYPE sglang:generation_tokens_total counter" in lines
    assert 'areal:paused{model_name="m\\"x"} 0.0' in lines
    assert 'areal:weight_update_draining{model_name="m\\"x"} 1.0' in lines


def test_parse_tool_calls() -> None:
    text = 'sure\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><tool_call>bad</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "sure\n<tool_call>bad</tool_call>"
    assert [c["function"] for c in calls] == [{"name": "f", "arguments": '{"x": 1}'}]
    assert parse_tool_calls("plain") == ("plain", [])
    assert parse_tool_calls('<tool_call>{"name": "g", "arguments": "{}"}</tool_call>')[0] is None


def test_check_tensors() -> None:
    specs = {"a": ((2, 2), torch.float32), "b": ((3,), torch.float32)}
    check_tensors({"a": torch.zeros(2, 2)}, specs, None)
    with pytest.raises(WeightTransportError, match="not in the served model"):
        check_tensors({"c": torch.zeros(1)}, specs, None)
    with pytest.raises(WeightTransportError, match="shape mismatch"):
        check_tensors({"a": torch.zeros(4)}, specs, None)
    with pytest.raises(WeightTransportError, match="lacks 1 weights"):
        check_tensors({"a": torch.zeros(2, 2)}, specs, {"a", "b"})


def test_only_set_fields_this_server_lacks_are_refused() -> None:
    from areal_tasks.inference.server.protocol import GenerateReqInput

    assert GenerateReqInput(input_ids=[1]).refused_fields() == []
    assert (
        GenerateReqInput(input_ids=[1], some_unknown_key=3, lora_path=None, return_hidden_states=False).refused_fields()
        == []
    )
    refused = GenerateReqInput(input_ids=[1], return_hidden_states=True, lora_path="a", unknown=1).refused_fields()
    assert refused == ["lora_path", "return_hidden_states"]
