"""``/generate`` over HTTP: SGLang's request and response shapes, greedy parity, batching, errors."""

from __future__ import annotations

import concurrent.futures

import pytest
from embedded_server import hf_greedy

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7, 8, 9]


def _generate(http, **body):
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_greedy_answer_matches_transformers_and_sglang_shape(http, reference) -> None:
    out = _generate(
        http,
        rid="greedy-1",
        input_ids=PROMPT,
        return_logprob=True,
        sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
    )
    assert out["output_ids"] == hf_greedy(reference, PROMPT, 12)
    meta = out["meta_info"]
    assert meta["id"] == "greedy-1"
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (5, 12, 0)
    assert isinstance(meta["weight_version"], str) and meta["e2e_latency"] >= 0
    assert meta["input_token_logprobs"] == [] and meta["output_token_logprobs_length"] == 12
    entries = meta["output_token_logprobs"]
    assert [e[1] for e in entries] == out["output_ids"]
    assert all(len(e) == 3 and e[2] is None and e[0] < 0 for e in entries)
    assert "weight_versions" not in meta


def test_text_prompt_stop_string_and_texts_in_logprobs(http) -> None:
    base = _generate(
        http, text="hello world", sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    )
    assert base["meta_info"]["prompt_tokens"] > 0
    stop = base["text"][3:6]
    out = _generate(
        http,
        text="hello world",
        return_logprob=True,
        return_text_in_logprobs=True,
        sampling_params={"max_new_tokens": 10, "temperature": 0, "ignore_eos": True, "stop": [stop]},
    )
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in out["text"] and base["text"].startswith(out["text"])
    assert all(isinstance(e[2], str) for e in out["meta_info"]["output_token_logprobs"])


def test_batch_and_n_answer_lists_in_prompt_major_order(http) -> None:
    batch = _generate(http, input_ids=[PROMPT, [11, 12]], sampling_params={"max_new_tokens": 3, "temperature": 0})
    assert isinstance(batch, list) and [o["meta_info"]["prompt_tokens"] for o in batch] == [5, 2]
    samples = _generate(
        http,
        rid="multi",
        input_ids=PROMPT,
        sampling_params={"max_new_tokens": 6, "n": 3, "sampling_seed": 9, "ignore_eos": True},
    )
    assert [o["meta_info"]["id"] for o in samples] == ["multi_0", "multi_1", "multi_2"]
    assert len({tuple(o["output_ids"]) for o in samples}) == 3
    again = _generate(
        http,
        rid="multi2",
        input_ids=PROMPT,
        sampling_params={"max_new_tokens": 6, "n": 3, "sampling_seed": 9, "ignore_eos": True},
    )
    assert [o["output_ids"] for o in again] == [o["output_ids"] for o in samples]


def test_concurrent_requests_equal_their_solo_answers(http) -> None:
    prompts = [[3 + i, 40 + i, 9] for i in range(6)]
    bodies = [
        {
            "input_ids": p,
            "sampling_params": {
                "max_new_tokens": 4 + 3 * i,
                "temperature": 0.8,
                "sampling_seed": i,
                "ignore_eos": True,
            },
        }
        for i, p in enumerate(prompts)
    ]
    solo = [_generate(http, **b)["output_ids"] for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: _generate(http, **b)["output_ids"], bodies))
    assert together == solo


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"input_ids": PROMPT, "stream": True}, "stream"),
        ({"input_ids": PROMPT, "image_data": "x.png"}, "image_data"),
        ({"input_ids": PROMPT, "sampling_params": {"bogus": 1}}, "unknown fields"),
        ({"input_ids": PROMPT, "sampling_params": {"regex": "a"}}, "regex"),
        ({"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
        ({"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"text": "a", "input_ids": PROMPT}, "exactly one"),
        ({"input_ids": [5000]}, "vocabulary"),
    ],
)
def test_unsupported_or_invalid_requests_answer_400(http, body, fragment) -> None:
    response = http.post("/generate", json=body)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


def test_health_and_model_info(http) -> None:
    assert http.get("/health").status_code == 200
    info = http.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_type"] == "qwen2"
    assert isinstance(info["weight_version"], str) and info["architectures"] == ["Qwen2ForCausalLM"]
    server_info = http.get("/server_info").json()
    assert server_info["max_context_length"] == 2048
    # areal serve froze its start-up heap (model, routes: areal_tasks/gc_heap.py), out of every later collection
    assert server_info["gc_frozen_objects"] > 10_000
