"""``decode_reply``: a reply body parses as the standard library's ``json`` parses it, through
msgspec where msgspec reads it and ``json`` where it does not; bodies that are not JSON stay text."""

from __future__ import annotations

import json
import logging
import random

import pytest

from areal_tasks.inference.client.transport import decode_reply

JSON = {"content-type": "application/json"}


def _answer(tokens: int) -> dict:
    rng = random.Random(tokens)
    return {
        "text": "ünïcode ✓ " * 3,
        "output_ids": [rng.randrange(150_000) for _ in range(tokens)],
        "meta_info": {
            "id": "a" * 32,
            "finish_reason": {"type": "length", "length": tokens},
            "e2e_latency": 1.25,
            "output_token_logprobs": [[-rng.random() * 5, rng.randrange(150_000), None] for _ in range(tokens)],
            "tiny": 1e-05,
            "negative_zero": -0.0,
            "big": 10**30,
        },
    }


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(_answer(256)).encode(),
        json.dumps([_answer(3), _answer(5)], ensure_ascii=False).encode(),
        b'{"a": 1, "a": 2}',
        b"[NaN, Infinity, -Infinity]",  # Python's json writes these; msgspec refuses them
        b"[1e400]",
        b'\xef\xbb\xbf{"bom": true}',
        b'  {"spaced" : [ ] }  ',
        b'"\\ud800"',
    ],
    ids=["answer", "batch", "duplicate-key", "nan-literals", "past-a-double", "bom", "spaces", "lone-surrogate"],
)
def test_json_bodies_parse_as_json_parses_them(body: bytes) -> None:
    got, expected = decode_reply("http://server", JSON, body), json.loads(body)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert type(got) is type(expected)


def test_a_body_that_is_not_json_stays_text(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert decode_reply("http://server", JSON, b"{not json") == "{not json"
    assert "answered invalid JSON" in caplog.text
    assert decode_reply("http://server", {"content-type": "text/plain"}, b'{"a": 1}') == '{"a": 1}'
    assert decode_reply("http://server", {}, b"\xff words") == "\ufffd words"
