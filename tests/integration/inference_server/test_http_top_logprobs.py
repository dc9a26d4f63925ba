"""``top_logprobs`` over HTTP: the official ``openai`` SDK and SGLang's ``/generate`` against the
session's ``areal serve`` process (``conftest.py``).

* ``/generate`` with ``top_logprobs_num``: SGLang's ``output_top_logprobs`` (and
  ``input_top_logprobs``) as ``[logprob, token_id, text]`` lists, equal to a transformers forward's
  ``log_softmax(logits / T)`` top k at those positions within 1e-4 (the repo's logprob parity
  tolerance), greedy and sampled;
* chat ``logprobs=True, top_logprobs=3`` and completions ``logprobs=2``, parsed by the SDK, carry
  the same alternatives as ``/generate`` for the same tokens, k per position, most likely first; the
  sampled token's logprob equals its entry when it is among them; streamed chunks carry the same.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoTokenizer

from areal_tasks.inference.server.detokenize import token_bytes
from areal_tasks.inference.server.openai_bodies import ChatCompletionRequest
from areal_tasks.inference.server.openai_routes import render_chat

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "user", "content": "tell me a story"}]
PROMPT = [5, 6, 7, 8, 9]
NEW_TOKENS = 12
ATOL = 1e-4
#: greedy, and sampled with a seed (the same tokens through every route).
SETTINGS = [{"temperature": 0.0}, {"temperature": 0.8, "seed": 11}]


@pytest.fixture(scope="module")
def client(server_url: str):
    with openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0, timeout=120) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2: Path):
    return AutoTokenizer.from_pretrained(tiny_qwen2)


def _native(http, prompt: list[int], setting: dict, k: int, **extra) -> dict:
    params = {"max_new_tokens": NEW_TOKENS, "temperature": setting["temperature"], "ignore_eos": True}
    if "seed" in setting:
        params["sampling_seed"] = setting["seed"]
    body = {"input_ids": prompt, "sampling_params": params, "return_logprob": True, "top_logprobs_num": k, **extra}
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _reference(model, prompt: list[int], output: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at each generated position, teacher-forced."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].double()
    return torch.log_softmax(logits / temperature, -1)


def _check_against(want: torch.Tensor, tops: list[list[list]], k: int) -> None:
    """Per position: k entries, descending, equal to the reference at their ids and to its k
    largest values (near-ties may swap order; the values may not differ)."""
    assert len(tops) == want.shape[0]
    for position, entry in zip(want, tops):
        values, ids = [e[0] for e in entry], [e[1] for e in entry]
        assert len(entry) == k and values == sorted(values, reverse=True)
        assert values == pytest.approx(position[ids].tolist(), abs=ATOL)
        assert values == pytest.approx(position.topk(k).values.tolist(), abs=ATOL)


@pytest.mark.parametrize("setting", SETTINGS, ids=["greedy", "sampled"])
def test_generate_top_logprobs_match_transformers(http, reference, tokenizer, setting) -> None:
    out = _native(http, PROMPT, setting, 4, return_text_in_logprobs=True, logprob_start_len=0)
    meta = out["meta_info"]
    want = _reference(reference, PROMPT, out["output_ids"], setting["temperature"] or 1.0)
    _check_against(want, meta["output_top_logprobs"], 4)
    for (logprob, token, _), entry in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
        assert all(text == tokenizer.decode([t]) for _, t, text in entry)
        if token in [t for _, t, _ in entry]:  # the sampled token's value is its entry's, exactly
            assert logprob == next(v for v, t, _ in entry if t == token)
    if setting["temperature"] == 0.0:
        assert [entry[0][1] for entry in meta["output_top_logprobs"]] == out["output_ids"]
    prompt_tops = meta["input_top_logprobs"]
    assert len(prompt_tops) == len(PROMPT) and prompt_tops[0] is None
    _check_against(_reference(reference, PROMPT[:1], PROMPT[1:], 1.0), prompt_tops[1:], 4)
    assert "output_top_logprobs" not in _native(http, PROMPT, setting, 0)["meta_info"]


def _chat_prompt(tokenizer) -> list[int]:
    return render_chat(ChatCompletionRequest(messages=MESSAGES), tokenizer)


@pytest.mark.parametrize("setting", SETTINGS, ids=["greedy", "sampled"])
def test_sdk_chat_top_logprobs(client, http, reference, tokenizer, setting) -> None:
    body = {
        "model": "m",
        "messages": MESSAGES,
        "max_tokens": NEW_TOKENS,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": {"ignore_eos": True},
        **setting,
    }
    whole = client.chat.completions.create(**body)
    content = whole.choices[0].logprobs.content
    prompt = _chat_prompt(tokenizer)
    native = _native(http, prompt, setting, 3)
    ids = native["output_ids"]
    assert [e.token for e in content] == [tokenizer.decode([t]) for t in ids], "not the same tokens"
    assert [e.logprob for e in content] == pytest.approx(
        [v for v, _, _ in native["meta_info"]["output_token_logprobs"]]
    )
    for entry, want in zip(content, native["meta_info"]["output_top_logprobs"]):
        assert [(a.token, a.bytes) for a in entry.top_logprobs] == [
            (tokenizer.decode([t]), token_bytes(tokenizer, t)) for _, t, _ in want
        ]
        assert [a.logprob for a in entry.top_logprobs] == pytest.approx([v for v, _, _ in want])
    for entry, (_, token, _), want in zip(
        content, native["meta_info"]["output_token_logprobs"], native["meta_info"]["output_top_logprobs"]
    ):
        at = [t for _, t, _ in want]
        if token in at:  # the sampled token's value is its entry's, exactly
            assert entry.top_logprobs[at.index(token)].logprob == entry.logprob
    want = _reference(reference, prompt, ids, setting["temperature"] or 1.0)
    _check_against(want, native["meta_info"]["output_top_logprobs"], 3)
    streamed = [
        e
        for chunk in client.chat.completions.create(stream=True, **body)
        for choice in chunk.choices
        if choice.logprobs
        for e in choice.logprobs.content
    ]
    assert [(e.token, e.bytes, [(a.token, a.bytes) for a in e.top_logprobs]) for e in streamed] == [
        (e.token, e.bytes, [(a.token, a.bytes) for a in e.top_logprobs]) for e in content
    ]
    for got, want in zip(streamed, content):
        assert [a.logprob for a in got.top_logprobs] == pytest.approx([a.logprob for a in want.top_logprobs])


@pytest.mark.parametrize("setting", SETTINGS, ids=["greedy", "sampled"])
def test_sdk_completion_top_logprobs(client, http, reference, tokenizer, setting) -> None:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": NEW_TOKENS, "logprobs": 2, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**body, **setting).choices[0].logprobs
    native = _native(http, PROMPT, setting, 2)["meta_info"]
    assert whole.token_logprobs == pytest.approx([v for v, _, _ in native["output_token_logprobs"]])
    assert len(whole.top_logprobs) == len(whole.tokens) == NEW_TOKENS
    for top, want in zip(whole.top_logprobs, native["output_top_logprobs"]):
        expected: dict[str, float] = {}
        for value, token, _ in want:
            expected.setdefault(tokenizer.decode([token]), value)
        assert top.keys() == expected.keys() and list(top.values()) == pytest.approx(list(expected.values()))
    for token, value, top in zip(whole.tokens, whole.token_logprobs, whole.top_logprobs):
        if token in top:
            assert top[token] >= value  # equal, unless another token with the same text ranks higher
    chunks = list(client.completions.create(stream=True, **body, **setting))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.top_logprobs]
    assert len(streamed) == NEW_TOKENS
    for got, want in zip(streamed, whole.top_logprobs):
        assert got.keys() == want.keys() and list(got.values()) == pytest.approx(list(want.values()))
