"""``tiny:<family>?key=value`` references: parsed values, errors, and the kit building that shape."""

from __future__ import annotations

import pytest

from areal_tasks.errors import ModelError
from areal_tasks.models.tiny.spec import parse_tiny_spec


def test_family_and_typed_overrides() -> None:
    assert parse_tiny_spec("tiny:qwen2") == ("qwen2", {})
    family, overrides = parse_tiny_spec("tiny:llama?hidden_size=128&rms_norm_eps=1e-5&tie_word_embeddings=true&x=abc")
    assert family == "llama"
    assert overrides == {"hidden_size": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "x": "abc"}


@pytest.mark.parametrize("bad", ["qwen2", "tiny:", "tiny:?hidden_size=1", "tiny:qwen2?hidden_size"])
def test_malformed_references_are_model_errors(bad: str) -> None:
    with pytest.raises(ModelError):
        parse_tiny_spec(bad)


def test_detect_builds_the_named_shape() -> None:
    from areal_tasks.models import detect_model

    info = detect_model("tiny:qwen2?hidden_size=96&intermediate_size=192")
    assert info.dims.hidden_size == 96 and info.dims.intermediate_size == 192
    with pytest.raises(ModelError, match="hiden_size"):
        detect_model("tiny:qwen2?hiden_size=96")
