"""The tiny tokenizer (round trips, digits, specials, chat template with tools) and load_tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest

from areal_tasks.errors import ModelError
from areal_tasks.models import build_tiny_tokenizer, load_tokenizer
from areal_tasks.models.tiny.corpus import synthetic_corpus
from areal_tasks.models.tiny.tokenizer_kit import TINY_VOCAB_SIZE

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate arithmetic.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful math tutor."},
    {"role": "user", "content": "What is 12 + 7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12 + 7"}}}],
    },
    {"role": "tool", "content": "19"},
    {"role": "assistant", "content": "12 + 7 = 19."},
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer("tiny")


@pytest.mark.parametrize(
    "text",
    ["Hello world!", "12 + 7 = 19", "  leading spaces, tabs\tand\nnewlines", "Ünïcödé ✓ 数学", "<think>ok</think>"],
)
def test_round_trip(tokenizer: Any, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_vocab_digits_and_specials(tokenizer: Any) -> None:
    assert len(tokenizer) == TINY_VOCAB_SIZE
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("x 2024 + 917")]
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("2024917")  # one token per digit
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</think>"):
        assert tokenizer.encode(token) == [tokenizer.convert_tokens_to_ids(token)]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_chat_template_with_tools(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a careful math tutor.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 + 7"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\n19<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n12 + 7 = 19.<|im_end|>\n")


def test_generation_prompt_and_no_tools(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(CONVERSATION[:2], tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a careful math tutor.<|im_end|>\n"
        "<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "# Tools" not in text


def test_assistant_mask_covers_only_assistant_output(tokenizer: Any) -> None:
    out = tokenizer.apply_chat_template(
        CONVERSATION, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    kept = tokenizer.decode([t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])
    assert kept.startswith("<tool_call>") and kept.endswith("12 + 7 = 19.<|im_end|>")
    assert "What is" not in kept and "tutor" not in kept


def test_misplaced_system_message_is_an_error(tokenizer: Any) -> None:
    with pytest.raises(jinja2.TemplateError, match="system message"):
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}], tokenize=False
        )


def test_missing_template_raises_with_fix(tmp_path: Path, tokenizer: Any) -> None:
    tokenizer.save_pretrained(str(tmp_path))
    (tmp_path / "chat_template.jinja").unlink()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"no chat template.*chat_template"):
        load_tokenizer(str(tmp_path))
    assert load_tokenizer(str(tmp_path), require_chat_template=False).chat_template is None


def test_unloadable_paths_raise(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="could not load a tokenizer"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ModelError, match="got a file"):
        load_tokenizer(str(tmp_path / "file.txt"))


def test_tokenizer_is_cached_and_corpus_deterministic() -> None:
    assert build_tiny_tokenizer() == build_tiny_tokenizer()
    assert list(synthetic_corpus(3, 50)) == list(synthetic_corpus(3, 50))
    assert list(synthetic_corpus(3, 50)) != list(synthetic_corpus(4, 50))
    assert any("=" in doc for doc in synthetic_corpus(0, 50)) and any(
        "<|im_start|>" in doc for doc in synthetic_corpus(0, 50)
    )
