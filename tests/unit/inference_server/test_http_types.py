"""Wire types are strict: a value of the wrong JSON type is a 400 naming the field, never a 500
(values were converted before they were checked) and never silently converted (``stop: {"a": 1}``
stopped on "a", ``true`` was token 1). What SGLang-protocol clients send keeps working."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
import pytest

from areal_tasks.inference.server.app import create_app
from areal_tasks.inference.server.service import EmbeddedServer

PROMPT = [1, 2, 3]


def _params(**params: Any) -> dict[str, Any]:
    return {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, **params}}


def _openai(**fields: Any) -> dict[str, Any]:
    return {"prompt": "hi", "max_tokens": 2, **fields}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


BAD_BODIES = [
    ("/generate", _params(temperature="hot"), "temperature"),
    ("/generate", _params(top_k="x"), "top_k"),
    ("/generate", _params(stop=123), "stop"),
    ("/generate", _params(stop={"a": 1}), "stop"),
    ("/generate", _params(stop=["a", 1]), "stop"),
    ("/generate", _params(stop_token_ids=[True]), "stop_token_ids"),
    ("/generate", _params(stop_token_ids=["5"]), "stop_token_ids"),
    ("/generate", _params(n=True), "n"),
    ("/generate", _params(n="2"), "n"),
    ("/generate", _params(top_p="nan"), "top_p"),
    ("/generate", _params(min_p=[0.1]), "min_p"),
    ("/generate", _params(ignore_eos="yes"), "ignore_eos"),
    ("/generate", _params(sampling_seed=1.5), "sampling_seed"),
    ("/generate", _params(temperature=10**400), "temperature"),
    ("/generate", {"input_ids": [True, False, True]}, "input_ids"),
    ("/generate", {"input_ids": ["1", "2"]}, "input_ids"),
    ("/generate", {"input_ids": PROMPT, "logprob_start_len": "1"}, "logprob_start_len"),
    ("/generate", {"input_ids": PROMPT, "return_logprob": "true"}, "return_logprob"),
    ("/generate", {"input_ids": PROMPT, "rid": 7}, "rid"),
    ("/generate", {"input_ids": PROMPT, "sampling_params": "greedy"}, "sampling_params"),
    ("/v1/completions", _openai(temperature="hot"), "temperature"),
    ("/v1/completions", _openai(top_k="x"), "top_k"),
    ("/v1/completions", _openai(stop=123), "stop"),
    ("/v1/completions", _openai(stop={"a": 1}), "stop"),
    ("/v1/completions", _openai(stop_token_ids=[True]), "stop_token_ids"),
    ("/v1/completions", _openai(n=True), "n"),
    ("/v1/completions", _openai(max_tokens=2.0), "max_tokens"),
    ("/v1/completions", _openai(prompt=[True, 2]), "prompt"),
    ("/v1/completions", _openai(logprobs=True), "logprobs"),
    ("/v1/chat/completions", _chat(temperature="hot"), "temperature"),
    ("/v1/chat/completions", _chat(stop={"a": 1}), "stop"),
    ("/v1/chat/completions", _chat(n=True), "n"),
    ("/v1/chat/completions", _chat(seed="1"), "seed"),
    ("/v1/chat/completions", _chat(logprobs=1), "logprobs"),
    ("/v1/chat/completions", _chat(messages="hi"), "messages"),
]

GOOD_BODIES = [
    ("/generate", _params(temperature=1, top_p=1, top_k=-1, min_p=0, stop=["\n"], stop_token_ids=[5])),
    ("/generate", _params(temperature=0.7, stop="x", stop_token_ids=[3, None], ignore_eos=True, sampling_seed=3)),
    ("/generate", {**_params(max_new_tokens=None, n=2), "return_logprob": True, "logprob_start_len": 0}),
    ("/generate", {"input_ids": [PROMPT, PROMPT], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]}),
    ("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 1}, "session_id": "ignored"}),
    ("/v1/completions", _openai(temperature=1, stop="x", n=2, seed=1, logprobs=0)),
    ("/v1/chat/completions", _chat(temperature=0, stop=["a"], logprobs=True, max_completion_tokens=1)),
]


def _post(server: EmbeddedServer, path: str, body: dict[str, Any]) -> httpx.Response:
    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(server))
        async with httpx.AsyncClient(transport=transport, base_url="http://server", timeout=60) as http:
            return await http.post(path, json=body)

    return asyncio.run(send())


@pytest.mark.parametrize(
    "path, body, field", BAD_BODIES, ids=[f"{p}-{f}-{i}" for i, (p, _, f) in enumerate(BAD_BODIES)]
)
def test_a_value_of_the_wrong_type_is_a_400_naming_the_field(server, path, body, field) -> None:
    response = _post(server, path, body)
    assert response.status_code == 400, response.text
    assert re.search(rf"\b{field}(\.|:| must)", response.json()["error"]["message"]), response.text


@pytest.mark.parametrize("path, body", GOOD_BODIES)
def test_what_sglang_and_openai_clients_send_is_accepted(server, path, body) -> None:
    response = _post(server, path, body)
    assert response.status_code == 200, response.text


def test_the_client_adapters_bodies_pass_the_strict_types(server) -> None:
    """The SGLang/embedded adapter's /generate body, from every sampling setting the config allows."""
    from areal_tasks.api.inference import SamplingParams
    from areal_tasks.inference.client.protocol import GenerateInput
    from areal_tasks.inference.client.sglang import SGLangAdapter

    sampling = SamplingParams(max_new_tokens=2, temperature=1, top_p=0.9, top_k=5, stop=("x",), stop_token_ids=(4,))
    for params in (sampling, SamplingParams(max_new_tokens=1, temperature=0.0, seed=7, ignore_eos=True)):
        call = SGLangAdapter().generate(GenerateInput("rid-0000", PROMPT, params))
        assert _post(server, call.path, call.json).status_code == 200
