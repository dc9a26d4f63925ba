"""The client's adapters and images: the SGLang-protocol (and embedded) adapters send a prompt's
``image_data``, a text prompt's body has none, and the vLLM adapter refuses images with the reason."""

from __future__ import annotations

import pytest

from areal_tasks.api.inference import SamplingParams
from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.client import GenerateInput, make_adapter

SAMPLING = SamplingParams(max_new_tokens=4)
IMAGES = ("aGVsbG8=", "data:image/png;base64,aGVsbG8=")


@pytest.mark.parametrize("backend", ["sglang", "embedded"])
def test_sglang_protocol_sends_image_data(backend: str) -> None:
    adapter = make_adapter(backend)
    body = adapter.generate(GenerateInput("r-0000", [1, 2], SAMPLING, IMAGES)).json
    assert body["image_data"] == list(IMAGES) and body["input_ids"] == [1, 2]
    assert "image_data" not in adapter.generate(GenerateInput("r-0001", [1, 2], SAMPLING)).json


def test_vllm_refuses_images_with_the_reason() -> None:
    adapter = make_adapter("vllm", model="m")
    with pytest.raises(InferenceRequestError, match="the vLLM backend takes no images"):
        adapter.generate(GenerateInput("r-0000", [1, 2], SAMPLING, IMAGES))
    assert "prompt" in adapter.generate(GenerateInput("r-0001", [1, 2], SAMPLING)).json
