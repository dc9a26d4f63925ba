"""Prompts with images for Qwen2-VL-style models: chat rendering, image placeholders and pixel inputs.

:class:`VisionProcessor` does what the family's transformers processor does for images, built from
the model directory's tokenizer and image processor only (``AutoTokenizer`` +
``AutoImageProcessor``). transformers' ``Qwen2VLProcessor`` also insists on a video processor, which
needs torchvision; the system never handles video, so it does not depend on either.

An image becomes ``grid_t * grid_h * grid_w / merge_size**2`` copies of the image pad token
(``<|image_pad|>``) between ``<|vision_start|>`` and ``<|vision_end|>``; the chat template renders one
pad per image part and :meth:`VisionProcessor.encode` expands each, in order, to its image's count.
The same expansion applies to token ids (:func:`expand_image_pads`), so a server can take prompts
with one pad per image, as SGLang does.

Pixel inputs are what the model's ``forward`` takes: ``pixel_values`` ``[patches, C * T * P * P]``
(float32) and ``image_grid_thw`` ``[images, 3]`` (int64). :func:`mm_token_type_ids` marks the image
tokens (1) for the multimodal rotary index (``get_rope_index``). :func:`encode_image` gives an image's
wire form (base64 PNG); the server's ``images.py`` reads it back, refusing anything but inline images.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ModelError

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

IMAGE_PAD = "<|image_pad|>"


@dataclass(frozen=True)
class VisionInputs:
    """One prompt ready for a VLM: expanded ``input_ids`` and the pixel inputs of its images."""

    input_ids: list[int]
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor

    @property
    def n_images(self) -> int:
        return int(self.image_grid_thw.shape[0])


def image_token_counts(image_grid_thw: torch.Tensor, merge_size: int) -> list[int]:
    """Language tokens each image takes: ``t * h * w / merge_size**2``."""
    return [int(n) // (merge_size * merge_size) for n in image_grid_thw.prod(dim=-1).tolist()]


def expand_image_pads(input_ids: Sequence[int], image_token_id: int, counts: Sequence[int]) -> list[int]:
    """``input_ids`` with the i-th image pad token repeated ``counts[i]`` times.

    ModelError when the prompt holds a different number of pads than there are images."""
    pads = sum(1 for t in input_ids if t == image_token_id)
    if pads != len(counts):
        raise ModelError(f"the prompt has {pads} image placeholder(s) for {len(counts)} image(s)")
    out: list[int] = []
    index = 0
    for token in input_ids:
        if token == image_token_id:
            out.extend([image_token_id] * counts[index])
            index += 1
        else:
            out.append(token)
    return out


def mm_token_type_ids(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """1 where ``input_ids`` holds an image token, else 0 (same shape, int32)."""
    return (input_ids == image_token_id).int()


def encode_image(image: Image, image_format: str = "PNG") -> str:
    """``image`` as base64 text of its PNG (or ``image_format``) bytes: the wire form of ``image_data``."""
    buffer = io.BytesIO()
    image.save(buffer, format=image_format)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


class VisionProcessor:
    """Tokenizer + image processor of one VLM directory (see the module doc)."""

    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.merge_size = int(getattr(image_processor, "merge_size", 2))
        token_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ModelError(f"the tokenizer has no {IMAGE_PAD} token: not a Qwen2-VL-style model")
        self.image_token_id = int(token_id)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> VisionProcessor:
        """Load from a model directory (or hub id) holding a tokenizer and ``preprocessor_config.json``."""
        from transformers import AutoImageProcessor, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            image_processor = AutoImageProcessor.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: cannot load the tokenizer and image processor of a VLM ({exc})") from exc
        return cls(tokenizer, image_processor)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The chat as text, one image pad per image part (through the model's chat template)."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def pixels(self, images: Sequence[Image]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pixel_values, image_grid_thw)`` of ``images`` as the model takes them."""
        out = self.image_processor(images=list(images), return_tensors="pt")
        return out["pixel_values"].float(), out["image_grid_thw"].long()

    def encode(self, text: str, images: Sequence[Image]) -> VisionInputs:
        """Tokenize ``text`` (one pad per image) and expand each pad to its image's token count."""
        import torch

        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if images:
            pixel_values, grid = self.pixels(images)
        else:
            pixel_values, grid = torch.zeros(0, 0), torch.zeros(0, 3, dtype=torch.long)
        counts = image_token_counts(grid, self.merge_size)
        return VisionInputs(expand_image_pads(ids, self.image_token_id, counts), pixel_values, grid)

    def encode_chat(self, messages: list[dict[str, Any]], images: Sequence[Image]) -> VisionInputs:
        """:meth:`render` then :meth:`encode` (``images`` in the order of the chat's image parts)."""
        return self.encode(self.render(messages), images)
