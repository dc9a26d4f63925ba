"""OpenAI-compatible routes over HTTP: chat template with tools, usage counts, completions, models."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

pytestmark = pytest.mark.integration

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the weather?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "look up the weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2):
    return AutoTokenizer.from_pretrained(tiny_qwen2)


def _rendered_len(tokenizer, tools) -> int:
    text = tokenizer.apply_chat_template(MESSAGES, tools=tools, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


def test_chat_renders_tools_into_the_template_and_counts_usage(http, tokenizer) -> None:
    body = {"model": "any", "messages": MESSAGES, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    with_tools = http.post("/v1/chat/completions", json={**body, "tools": TOOLS, "logprobs": True}).json()
    without = http.post("/v1/chat/completions", json=body).json()
    none_choice = http.post("/v1/chat/completions", json={**body, "tools": TOOLS, "tool_choice": "none"}).json()
    assert with_tools["usage"]["prompt_tokens"] == _rendered_len(tokenizer, TOOLS)
    assert without["usage"]["prompt_tokens"] == _rendered_len(tokenizer, None) < _rendered_len(tokenizer, TOOLS)
    assert none_choice["usage"]["prompt_tokens"] == without["usage"]["prompt_tokens"]
    usage = with_tools["usage"]
    assert usage["completion_tokens"] == 6 and usage["total_tokens"] == usage["prompt_tokens"] + 6
    choice = with_tools["choices"][0]
    assert with_tools["object"] == "chat.completion" and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length" and len(choice["logprobs"]["content"]) == 6
    assert all(entry["logprob"] <= 0 for entry in choice["logprobs"]["content"])
    assert isinstance(with_tools["metadata"]["weight_version"], str)


def test_chat_n_samples_and_bad_messages(http) -> None:
    out = http.post(
        "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3, "n": 2, "seed": 1, "ignore_eos": True}
    ).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    assert out["choices"][0]["message"]["content"] != out["choices"][1]["message"]["content"]
    assert out["usage"]["completion_tokens"] == 6
    bad = http.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
    assert bad.status_code == 400 and "chat template" in bad.json()["error"]["message"]


def test_completions_with_text_and_token_prompts(http) -> None:
    out = http.post(
        "/v1/completions",
        json={"prompt": "hello there", "max_tokens": 4, "temperature": 0, "ignore_eos": True, "logprobs": 0},
    ).json()
    assert out["object"] == "text_completion" and out["usage"]["completion_tokens"] == 4
    choice = out["choices"][0]
    assert len(choice["logprobs"]["token_logprobs"]) == 4 and choice["finish_reason"] == "length"
    batch = http.post("/v1/completions", json={"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 2}).json()
    assert len(batch["choices"]) == 2 and batch["usage"]["prompt_tokens"] == 5


def test_models_lists_the_served_model(http) -> None:
    data = http.get("/v1/models").json()["data"]
    assert len(data) == 1 and data[0]["object"] == "model" and data[0]["max_model_len"] == 2048
