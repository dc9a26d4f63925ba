"""``areal serve`` with the tiny Qwen2-VL over HTTP: images as SGLang's ``image_data`` and as OpenAI
``image_url`` parts, greedy answers equal to transformers', and every bad image or placeholder a
clean 400 after which the server still serves; images sent to the text model's server are refused.
(The engine's equivalence for both families, batching included, is in the unit tests.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from embedded_server import running_server

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter
from areal_tasks.models.tiny.vision_kit import VISION_IDS
from areal_tasks.models.vision_processor import VisionProcessor, encode_image, expand_image_pads, image_token_counts

pytestmark = pytest.mark.integration

PAD, START, END = VISION_IDS["<|image_pad|>"], VISION_IDS["<|vision_start|>"], VISION_IDS["<|vision_end|>"]
PROMPT = [40, 41, START, PAD, END, 42, 43]
NEW_TOKENS = 6
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS}


def _image(seed: int, width: int, height: int) -> Any:
    from PIL import Image

    pixels = torch.randint(0, 256, (height, width, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


@pytest.fixture(scope="module")
def vlm_path(tiny_qwen2_vl: Path) -> Path:
    return tiny_qwen2_vl


@pytest.fixture(scope="module")
def vlm_url(vlm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("vision-server") / "server.log"
    with running_server(vlm_path, log, "--context-length", "512", "--max-running-requests", "4") as url:
        yield url


@pytest.fixture(scope="module")
def vlm(vlm_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vlm_url, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def processor(vlm_path: Path) -> VisionProcessor:
    return VisionProcessor.from_pretrained(vlm_path)


@pytest.fixture(scope="module")
def reference(vlm_path: Path) -> Any:
    from transformers import AutoModelForImageTextToText

    torch.set_num_threads(1)
    return AutoModelForImageTextToText.from_pretrained(vlm_path, dtype=torch.float32).eval()


@torch.inference_mode()
def _greedy(reference: Any, processor: VisionProcessor, ids: list[int], images: list[Any]) -> tuple[list, list]:
    """transformers' greedy ids and their log-probs for ``ids`` (one pad per image) and ``images``."""
    pixel_values, grid = processor.pixels(images)
    expanded = torch.tensor([expand_image_pads(ids, PAD, image_token_counts(grid, processor.merge_size))])
    out = reference.generate(
        input_ids=expanded,
        attention_mask=torch.ones_like(expanded),
        pixel_values=pixel_values,
        image_grid_thw=grid,
        mm_token_type_ids=(expanded == PAD).int(),
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    output = out.sequences[0, expanded.shape[1] :].tolist()
    logprobs = [torch.log_softmax(step[0], -1)[token].item() for step, token in zip(out.logits, output)]
    return output, logprobs


def _generate(client: httpx.Client, **body: Any) -> Any:
    response = client.post("/generate", json={"sampling_params": GREEDY, "return_logprob": True, **body})
    assert response.status_code == 200, response.text
    return response.json()


def _answer(payload: dict[str, Any]) -> tuple[list[int], list[float]]:
    entries = payload["meta_info"]["output_token_logprobs"]
    return payload["output_ids"], [value for value, _, _ in entries]


def test_generate_with_image_data_equals_transformers(vlm, processor, reference) -> None:
    image = _image(0, 48, 40)
    expected_ids, expected_logprobs = _greedy(reference, processor, PROMPT, [image])
    wire = encode_image(image)
    one_pad = _generate(vlm, input_ids=PROMPT, image_data=wire)
    ids, logprobs = _answer(one_pad)
    assert ids == expected_ids
    assert logprobs == pytest.approx(expected_logprobs, abs=2e-5)
    # the processor's expanded placeholders and a data URL give the same answer
    _, grid = processor.pixels([image])
    expanded = expand_image_pads(PROMPT, PAD, image_token_counts(grid, processor.merge_size))
    same = _generate(vlm, input_ids=expanded, image_data=[f"data:image/png;base64,{wire}"])
    assert same["output_ids"] == ids and same["meta_info"]["prompt_tokens"] == len(expanded)


def test_batch_with_two_images_and_a_text_prompt(vlm, processor, reference) -> None:
    images = [_image(1, 64, 32), _image(2, 32, 64)]
    two = [40, START, PAD, END, 41, START, PAD, END, 42]
    text = [40, 41, 42, 43]
    answers = _generate(vlm, input_ids=[two, text], image_data=[[encode_image(i) for i in images], None])
    assert _answer(answers[0])[0] == _greedy(reference, processor, two, images)[0]
    with torch.inference_mode():
        expected_text = reference.generate(torch.tensor([text]), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert _answer(answers[1])[0] == expected_text[0, len(text) :].tolist()


def test_chat_with_an_image_url_part(vlm, processor) -> None:
    image = _image(3, 56, 48)
    url = f"data:image/png;base64,{encode_image(image)}"
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "what is it?"}, {"type": "image_url", "image_url": {"url": url}}],
        }
    ]
    body = {"messages": messages, "temperature": 0.0, "max_tokens": NEW_TOKENS, "logprobs": True}
    chat = vlm.post("/v1/chat/completions", json=body)
    assert chat.status_code == 200, chat.text
    expected = processor.encode_chat(messages, [image])
    assert chat.json()["usage"]["prompt_tokens"] == len(expected.input_ids)
    native = _generate(vlm, input_ids=expected.input_ids, image_data=[url])
    tokens = [entry["token"] for entry in chat.json()["choices"][0]["logprobs"]["content"]]
    assert len(tokens) == len(native["output_ids"])
    assert chat.json()["choices"][0]["message"]["content"] == native["text"]


def _huge_png() -> str:
    from PIL import Image

    return encode_image(Image.new("L", (5000, 5000)))


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"input_ids": PROMPT, "image_data": "not base64!"}, "image_data[0]: not base64"),
        ({"input_ids": PROMPT, "image_data": ["aGVsbG8gd29ybGQ="]}, "image_data[0]: not an image file"),
        ({"input_ids": PROMPT, "image_data": "HUGE"}, "image_data[0]: the image is 5000x5000 pixels"),
        ({"input_ids": PROMPT, "image_data": "http://127.0.0.1:9/cat.png"}, "fetches no URL"),
        ({"input_ids": PROMPT, "image_data": "/etc/hosts"}, "paths and URLs are never read"),
        ({"input_ids": [*PROMPT, PAD], "image_data": "IMAGE"}, "hold 2 <|image_pad|> tokens"),
        ({"input_ids": PROMPT}, "hold 1 <|image_pad|> tokens (runs of [1]); the 0 images need 0"),
        ({"input_ids": [[1], [2]], "image_data": ["IMAGE"]}, "a batch of 2 prompts needs a list of 2 entries"),
    ],
    ids=["not-base64", "not-an-image", "huge", "http-url", "path", "pad-count", "pads-without-image", "batch-shape"],
)
def test_bad_images_answer_400_and_the_server_keeps_serving(vlm, body: dict[str, Any], fragment: str) -> None:
    good = encode_image(_image(4, 32, 32))
    if body.get("image_data") in ("HUGE", ["IMAGE"], "IMAGE"):
        value = body["image_data"]
        body = {**body, "image_data": _huge_png() if value == "HUGE" else [good] if value == ["IMAGE"] else good}
    response = vlm.post("/generate", json={"sampling_params": GREEDY, **body})
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]
    assert _generate(vlm, input_ids=PROMPT, image_data=good)["meta_info"]["finish_reason"]["type"] in ("length", "stop")


def test_chat_image_url_must_be_a_data_url(vlm) -> None:
    part = {"type": "image_url", "image_url": {"url": "https://127.0.0.1:9/cat.png"}}
    body = {"messages": [{"role": "user", "content": [part]}], "max_tokens": 2}
    response = vlm.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "messages[0].content[0].image_url.url"
    assert vlm.get("/get_model_info").json()["has_image_understanding"] is True


def test_images_to_a_text_model_are_refused(http) -> None:
    image = encode_image(_image(5, 32, 32))
    response = http.post("/generate", json={"input_ids": [1, 2, 3], "image_data": image})
    assert response.status_code == 400
    assert "no vision tower" in response.json()["error"]["message"]
    part = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}
    chat = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [part]}], "max_tokens": 2})
    assert chat.status_code == 400 and "no vision tower" in chat.json()["error"]["message"]
    assert http.get("/get_model_info").json()["has_image_understanding"] is False


def test_resubmitted_rollout_with_a_sampled_pad(vlm, processor) -> None:
    """A partial rollout sent again: the expanded prompt, then its output so far, a pad among it."""
    image = _image(6, 40, 40)
    _, grid = processor.pixels([image])
    expanded = expand_image_pads(PROMPT, PAD, image_token_counts(grid, processor.merge_size))
    answer = _generate(vlm, input_ids=[*expanded, 45, PAD, 46], image_data=encode_image(image))
    assert answer["meta_info"]["prompt_tokens"] == len(expanded) + 3


def test_continuing_from_a_partial_output_equals_one_run(vlm, processor) -> None:
    """What a partial rollout resubmitted after an abort gets: the prompt plus the output so far
    (its rotary positions recomputed by the server) continues exactly as one run would."""
    image = encode_image(_image(7, 48, 64))
    whole = _generate(vlm, input_ids=PROMPT, image_data=image)
    half = NEW_TOKENS // 2
    first = _generate(vlm, input_ids=PROMPT, image_data=image, sampling_params={**GREEDY, "max_new_tokens": half})
    prompt = [*PROMPT[:3], *[PAD] * (first["meta_info"]["prompt_tokens"] - len(PROMPT) + 1), *PROMPT[4:]]
    rest = _generate(
        vlm,
        input_ids=prompt + first["output_ids"],
        image_data=image,
        sampling_params={**GREEDY, "max_new_tokens": NEW_TOKENS - half},
    )
    assert first["output_ids"] + rest["output_ids"] == whole["output_ids"]
    assert _answer(first)[1] + _answer(rest)[1] == pytest.approx(_answer(whole)[1], abs=2e-5)


def test_client_sends_the_images(vlm, vlm_url: str) -> None:
    import asyncio

    image = encode_image(_image(8, 40, 56))
    expected = _generate(vlm, input_ids=PROMPT, image_data=image)

    async def scenario() -> list[int]:
        client = RemoteInferenceEngine([vlm_url], make_adapter("embedded"), ClientConfig())
        async with client as engine:
            sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
            response = await engine.agenerate(ModelRequest(PROMPT, sampling, image_data=(image,)))
            return response.output_ids

    assert asyncio.run(scenario()) == expected["output_ids"]


def test_text_prompt_with_a_placeholder_and_image_data(vlm, processor) -> None:
    image = _image(9, 32, 48)
    text = "<|vision_start|><|image_pad|><|vision_end|>what is it?"
    answer = _generate(vlm, text=text, image_data=encode_image(image))
    assert answer["meta_info"]["prompt_tokens"] == len(processor.encode(text, [image]).input_ids)
