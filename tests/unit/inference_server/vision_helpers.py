"""Helpers of the vision tests: test images on the wire, prompts with image placeholders, and
transformers' greedy answer for them (``generate`` for the ids, a full forward for the log-probs)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import torch

from areal_tasks.models.tiny.vision_kit import VISION_IDS

VISION_START, VISION_END = VISION_IDS["<|vision_start|>"], VISION_IDS["<|vision_end|>"]
IMAGE_PAD = VISION_IDS["<|image_pad|>"]


def png(seed: int, width: int, height: int, image_format: str = "PNG") -> str:
    """Base64 of a random RGB image's file bytes."""
    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buffer, format=image_format)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def prompt_with_images(n_images: int, text: tuple[int, ...] = (40, 41, 42)) -> list[int]:
    """Text, then each image's one-pad placeholder followed by text (the server expands the pads)."""
    ids = list(text)
    for i in range(n_images):
        ids += [VISION_START, IMAGE_PAD, VISION_END, 50 + i, 60 + i]
    return ids


def load_reference(path: Path) -> Any:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def reference_greedy(
    model: Any, ids: list[int], vision: Any | None, max_new_tokens: int
) -> tuple[list[int], list[float]]:
    """transformers' greedy output ids for the expanded prompt ``ids`` with the images of ``vision``
    (a ``VisionPrompt``; None for text) and each output token's log-prob, from ``model.generate``'s
    raw logits (a full forward over prompt + output would take an output ``<|image_pad|>``, which
    the tiny models do sample, for an image placeholder)."""
    x = torch.tensor([ids])
    extra: dict[str, Any] = {}
    if vision is not None:
        extra = {
            "pixel_values": vision.pixel_values,
            "image_grid_thw": vision.image_grid_thw,
            "mm_token_type_ids": (x == IMAGE_PAD).int(),
        }
    out = model.generate(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        **extra,
    )
    output = out.sequences[0, len(ids) :].tolist()
    logprobs = [torch.log_softmax(step[0].float(), -1)[token].item() for step, token in zip(out.logits, output)]
    return output, logprobs
