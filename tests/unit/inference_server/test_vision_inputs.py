"""Images on the wire and their placeholders: what the server accepts, and the 400s for the rest
(not base64, not an image, too large, a URL or a path, placeholder counts that do not match the
images, chat image parts that are not data URLs)."""

from __future__ import annotations

import base64
import io

import pytest
import torch
from vision_helpers import IMAGE_PAD, png

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.images import MAX_IMAGE_PIXELS, MAX_IMAGES_PER_PROMPT, decode_images, image_bytes
from areal_tasks.inference.server.openai_images import chat_images, without_images
from areal_tasks.inference.server.protocol import GenerateReqInput, split_generate
from areal_tasks.inference.server.vision import VisionPrompt, expand_pads


def _refused(match: str, fn, *args) -> InferenceRequestError:
    with pytest.raises(InferenceRequestError, match=match) as info:
        fn(*args)
    return info.value


def test_base64_and_data_urls_decode_to_rgb_images() -> None:
    raw = png(0, 20, 10)
    jpeg = png(1, 16, 16, "JPEG")
    assert jpeg.startswith("/9j/")  # base64 of a JPEG starts with '/': it is no path
    images = decode_images([raw, f"data:image/png;base64,{raw}", jpeg])
    assert [(im.mode, im.size) for im in images] == [("RGB", (20, 10)), ("RGB", (20, 10)), ("RGB", (16, 16))]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("not base64 at all!", r"image_data\[0\]: not base64"),
        ("/tmp/cat.png", r"image_data\[0\]: not base64 \(paths and URLs are never read"),
        ("http://example.com/cat.png", r"image_data\[0\]: a http: URL; this server fetches no URL"),
        ("file:///etc/passwd", r"a file: URL"),
        ("data:text/plain;base64,aGVsbG8=", r"a data URL of type 'text/plain', not image"),
        ("data:image/png,rawbytes", r"without ;base64"),
        ("", r"must be a non-empty string"),
    ],
)
def test_what_is_not_an_inline_image_is_refused(value: str, match: str) -> None:
    error = _refused(match, image_bytes, value, 0)
    assert error.param == "image_data"


def test_bytes_that_are_no_image_are_refused_by_index() -> None:
    text = base64.b64encode(b"plain text, not an image").decode()
    _refused(r"image_data\[1\]: not an image file", decode_images, [png(0, 8, 8), text])


def test_huge_image_is_refused_before_its_pixels_are_decoded() -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (4200, 4200)).save(buffer, format="PNG")  # compresses to a few KB
    assert MAX_IMAGE_PIXELS < 4200 * 4200
    huge = base64.b64encode(buffer.getvalue()).decode()
    _refused(r"image_data\[0\]: the image is 4200x4200 pixels", decode_images, [huge])


def test_too_many_images_for_one_prompt() -> None:
    _refused(f"at most {MAX_IMAGES_PER_PROMPT}", decode_images, [png(0, 4, 4)] * (MAX_IMAGES_PER_PROMPT + 1))


def test_placeholders_expanded_or_one_per_image() -> None:
    pad = IMAGE_PAD
    one_each = [1, pad, 2, pad, 3]
    expanded = [1, pad, pad, pad, 2, pad, pad, 3]
    where = [1, 2, 3, 5, 6]
    assert expand_pads(one_each, [3, 2], pad) == (expanded, where)
    assert expand_pads(expanded, [3, 2], pad) == (expanded, where)
    assert expand_pads([1, 2], [], pad) == ([1, 2], [])


def test_pads_after_the_expanded_placeholders_are_text() -> None:
    """A resubmitted partial rollout: the expanded prompt, then sampled tokens, a pad among them."""
    pad = IMAGE_PAD
    resubmitted = [1, pad, pad, pad, 2, pad, 7, pad]
    assert expand_pads(resubmitted, [3], pad) == (resubmitted, [1, 2, 3])


@pytest.mark.parametrize(
    ("ids", "counts", "match"),
    [
        ([1, IMAGE_PAD, 2], [3, 2], r"hold 1 <\|image_pad\|> tokens .* the 2 images need 5 .* or 2"),
        ([1, IMAGE_PAD, IMAGE_PAD, 2], [3], r"hold 2 .* need 3 .* or 1"),
        ([1, IMAGE_PAD, 2], [], r"hold 1 .* the 0 images need 0"),
        ([1, IMAGE_PAD, 2, IMAGE_PAD], [3], r"hold 2 .*runs of \[1, 1\]"),
        ([1, 2], [4], r"hold 0 .* need 4"),
    ],
)
def test_placeholder_count_mismatch_names_both_counts(ids: list[int], counts: list[int], match: str) -> None:
    assert _refused(match, expand_pads, ids, counts, IMAGE_PAD).param == "input_ids"


def test_positions_of_a_prompt_followed_by_output() -> None:
    positions = torch.tensor([[0, 1, 1, 1, 3], [0, 1, 1, 2, 3], [0, 1, 2, 1, 3]])
    prompt = VisionPrompt(torch.zeros(4, 2), torch.tensor([[1, 2, 2]]), torch.tensor([1, 2, 3]), positions, -1)
    torch.testing.assert_close(prompt.positions_for(5), positions)
    torch.testing.assert_close(prompt.positions_for(7)[:, 5:], torch.tensor([[4, 5]] * 3))


def test_generate_body_images_per_prompt() -> None:
    image = png(0, 8, 8)
    one, _ = split_generate(GenerateReqInput(input_ids=[1, 2], image_data=image), None)
    assert one[0]["image_data"] == [image]
    batch, is_batch = split_generate(
        GenerateReqInput(input_ids=[[1], [2], [3]], image_data=[image, None, [image]]), None
    )
    assert is_batch
    assert [item.get("image_data") for item in batch] == [[image], None, [image]]
    assert [item.get("image_field") for item in batch] == ["image_data[0]", None, "image_data[2]"]
    _refused(
        r"a batch of 2 prompts needs a list of 2 entries",
        split_generate,
        GenerateReqInput(input_ids=[[1], [2]], image_data=[image]),
        None,
    )
    _refused(
        r"for one prompt, give a string or a list of strings",
        split_generate,
        GenerateReqInput(input_ids=[1], image_data=[[image]]),
        None,
    )


def test_chat_image_parts_take_data_urls_only() -> None:
    url = f"data:image/png;base64,{png(0, 8, 8)}"
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}],
        },
    ]
    assert chat_images(messages) == [url]
    assert without_images(messages)[1]["content"] == [{"type": "text", "text": "what?"}]
    messages[1]["content"][1]["image_url"]["url"] = "https://example.com/cat.png"
    error = _refused(
        r"messages\[1\].content\[1\].image_url.url: only data: URLs are accepted \('https'", chat_images, messages
    )
    assert error.param == "messages[1].content[1].image_url.url"
