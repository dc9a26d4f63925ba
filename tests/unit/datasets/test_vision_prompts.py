"""Chats with images through the tiny Qwen2-VL's processor: prompts with their placeholders expanded as
the model expects, SFT transcripts whose mask trains exactly the assistant's tokens (never an image),
and the errors of a chat whose images do not match."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from areal_tasks.datasets.prompts import render_messages
from areal_tasks.datasets.shapes import ShapesOptions, generate_visual_splits
from areal_tasks.datasets.vision_prompts import (
    load_processor,
    render_vision_prompt,
    render_vision_transcript,
    with_image_parts,
)
from areal_tasks.errors import ConfigError
from areal_tasks.models.tiny.vision_kit import VISION_IDS
from areal_tasks.models.tokenizer import load_tokenizer
from areal_tasks.models.vision_processor import VisionProcessor

PAD = VISION_IDS["<|image_pad|>"]
SYSTEM = {"role": "system", "content": "Reply with 'Answer: <integer>'."}


@pytest.fixture(scope="module")
def processor(tiny_qwen2_vl: Path) -> VisionProcessor:
    return load_processor(load_tokenizer(str(tiny_qwen2_vl)))


@pytest.fixture(scope="module")
def images() -> list:
    train, _ = generate_visual_splits(ShapesOptions(kind="count", n_train=2, n_eval=0))
    return [p.image() for p in train]


def test_with_image_parts_adds_them_before_the_first_user_text_or_keeps_them() -> None:
    chat = [SYSTEM, {"role": "user", "content": "How many?"}]
    shown = with_image_parts(chat, 2)
    assert shown[1]["content"] == [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "How many?"}]
    assert chat[1]["content"] == "How many?"  # the input is not changed
    assert with_image_parts(shown, 2) == shown
    with pytest.raises(ConfigError, match="the chat has 2 image parts but 1 images come with it"):
        with_image_parts(shown, 1)
    with pytest.raises(ConfigError, match="no user turn"):
        with_image_parts([SYSTEM], 1)


def test_a_prompt_holds_each_image_as_its_tokens_and_the_pixels_match(processor, images) -> None:
    chat = with_image_parts([SYSTEM, {"role": "user", "content": "How many shapes?"}], 2)
    ids, multimodal = render_vision_prompt(processor, chat, images)
    # two 64x64 images: 8x8 patches each, merged 2x2 -> 16 tokens each, in two runs
    assert ids.count(PAD) == 32
    runs = "".join("x" if t == PAD else "." for t in ids).split(".")
    assert sorted(len(r) for r in runs if r) == [16, 16]
    assert multimodal["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]
    assert multimodal["pixel_values"].shape == (128, 384) and multimodal["pixel_values"].dtype == torch.float32
    pixel_values, grid = processor.pixels(images)
    assert torch.equal(multimodal["pixel_values"], pixel_values) and torch.equal(multimodal["image_grid_thw"], grid)
    assert processor.tokenizer.decode(ids).endswith("<|im_start|>assistant\n")


def test_a_transcript_trains_the_answer_and_never_an_image(processor, images) -> None:
    chat = [
        SYSTEM,
        *with_image_parts([{"role": "user", "content": "How many shapes?"}], 1),
        {"role": "assistant", "content": "Answer: 3"},
    ]
    ids, mask, multimodal = render_vision_transcript(processor, chat, images[:1])
    assert len(ids) == len(mask) and ids.count(PAD) == 16
    assert all(m == 0 for t, m in zip(ids, mask) if t == PAD)
    trained = [t for t, m in zip(ids, mask) if m]
    assert processor.tokenizer.decode(trained) == "Answer: 3<|im_end|>"
    # the prompt part equals what a policy generates from
    prompt_ids, _ = render_vision_prompt(processor, chat[:-1], images[:1])
    assert ids[: len(prompt_ids)] == prompt_ids and not any(mask[: len(prompt_ids)])
    assert multimodal["image_grid_thw"].tolist() == [[1, 8, 8]]
    # a text chat's transcript through the same tokenizer has the same mask rule
    text_ids, text_mask = render_messages(processor.tokenizer, [SYSTEM, {"role": "user", "content": "Hi"}, chat[-1]])
    assert processor.tokenizer.decode([t for t, m in zip(text_ids, text_mask) if m]) == "Answer: 3<|im_end|>"


def test_mismatched_images_and_non_vision_models_are_config_errors(processor, images, tiny_qwen2: Path) -> None:
    chat = [*with_image_parts([{"role": "user", "content": "How many?"}], 2), {"role": "assistant", "content": "x"}]
    with pytest.raises(ConfigError, match=r"2 image placeholder\(s\) for 1 image\(s\)"):
        render_vision_transcript(processor, chat, images[:1])
    with pytest.raises(ConfigError, match="cannot render the prompt's images"):
        render_vision_prompt(processor, chat[:1], images[:1])
    assert load_processor(processor) is processor
    with pytest.raises(ConfigError, match="has no image processor"):
        load_processor(load_tokenizer(str(tiny_qwen2)))
    with pytest.raises(ConfigError, match="is not a model directory"):
        load_processor(load_tokenizer(str(tiny_qwen2)), processor="/nonexistent/vlm")
