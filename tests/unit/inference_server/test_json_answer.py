"""``JsonAnswer`` (``json_answer.py``): a ``/generate`` answer written by msgspec is the JSON value
Starlette's ``JSONResponse`` wrote, compact and in the same key order; a non-finite float is
``null`` (as SGLang's orjson writes it) instead of a failed request."""

from __future__ import annotations

import json
import math
import random

from starlette.responses import JSONResponse

from areal_tasks.inference.server.json_answer import JsonAnswer


def _answer() -> dict:
    rng = random.Random(0)
    return {
        "text": 'ünïcode ✓ \n\t"quoted" \\',
        "output_ids": [rng.randrange(150_000) for _ in range(256)],
        "meta_info": {
            "id": "a" * 32,
            "finish_reason": {"type": "stop", "matched": "\n"},
            "weight_version": "3",
            "e2e_latency": 0.123456789,
            "output_token_logprobs": [[-rng.random() * 20, rng.randrange(150_000), None] for _ in range(256)],
            "output_top_logprobs": [None, [[-0.5, 7, "x"], [-1e-07, 8, None]]],
            "extremes": [1e-05, -0.0, 5e-324, 1.7976931348623157e308, 2**63, -(2**70)],
        },
    }


def test_the_same_json_value_in_the_same_shape() -> None:
    answers = [_answer(), [_answer(), _answer()]]
    for content in answers:
        ours, theirs = JsonAnswer(content), JSONResponse(content)
        assert json.loads(ours.body) == json.loads(theirs.body) == json.loads(json.dumps(content))
        assert list(json.loads(ours.body)) == list(json.loads(theirs.body))  # key order kept
        assert b": " not in ours.body and b", " not in ours.body  # compact, as before
    assert JsonAnswer({}).headers["content-type"] == "application/json"
    assert JsonAnswer({}, status_code=400).status_code == 400


def test_a_non_finite_float_is_null() -> None:
    body = json.loads(JsonAnswer({"logprobs": [-math.inf, math.nan, 1.0]}).body)
    assert body == {"logprobs": [None, None, 1.0]}
