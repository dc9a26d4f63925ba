"""Chats with images rendered for a vision-language model (the text twin: ``prompts.py``).

A chat shows its images as content parts ``{"type": "image"}`` (:func:`with_image_parts` adds them
to a text chat); the model's chat template writes one placeholder per image and the model's
:class:`~areal_tasks.models.vision_processor.VisionProcessor` (its tokenizer and image processor)
expands each to the image's token count and computes the pixel inputs.

* :func:`load_processor`: the ``VisionProcessor`` of a model directory (or of the directory a
  tokenizer was loaded from, reusing that tokenizer).
* :func:`render_vision_prompt`: ``(input_ids, multimodal)`` of a chat with the assistant header (what
  a policy generates from); ``multimodal`` is ``{"pixel_values": [P, D] float32,
  "image_grid_thw": [N, 3] int64}``, the keys of ``Trajectory.multimodal``.
* :func:`render_vision_transcript`: ``(input_ids, assistant_mask, multimodal)`` of a whole SFT chat:
  the mask comes from the chat template's ``{% generation %}`` block (as ``render_messages``), on the
  text with one placeholder per image, then each placeholder is widened to its image's tokens (never
  trained); the ids are checked against the processor's own expansion of the rendered text.

transformers (and torch) are imported when a processor is loaded or called.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from areal_tasks.models.vision_processor import VisionProcessor

logger = logging.getLogger(__name__)

__all__ = ["IMAGE_PARTS", "load_processor", "render_vision_prompt", "render_vision_transcript", "with_image_parts"]

#: content part types that stand for an image in a chat message.
IMAGE_PARTS = ("image", "image_url")


def load_processor(tokenizer: Any, processor: str | None = None) -> VisionProcessor:
    """The processor images are rendered with: ``tokenizer`` itself when it is one; the processor
    (tokenizer and image processor) of the model directory ``processor`` when given; else
    ``tokenizer`` paired with the image processor of the directory it was loaded from
    (``name_or_path``). ConfigError when there is none, or the model is not a vision-language model."""
    from areal_tasks.models.vision_processor import VisionProcessor

    if isinstance(tokenizer, VisionProcessor):
        return tokenizer
    source = processor or getattr(tokenizer, "name_or_path", None)
    if not source or not Path(str(source)).expanduser().is_dir():
        raise ConfigError(
            f"images need the model's image processor, and {source!r} is not a model directory; set "
            "rollout.workflow.options.processor to the vision-language model's directory"
        )
    from transformers import AutoImageProcessor

    try:
        if processor:
            return VisionProcessor.from_pretrained(Path(processor).expanduser())
        return VisionProcessor(tokenizer, AutoImageProcessor.from_pretrained(str(source)))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{source!r} has no image processor ({type(exc).__name__}: {exc}); images need a vision-language "
            "model directory (preprocessor_config.json)"
        ) from exc
    except ModelError as exc:
        raise ConfigError(f"{source!r}: {exc}; images need a vision-language model directory") from exc


def _count_image_parts(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, Mapping) and part.get("type") in IMAGE_PARTS
    )


def with_image_parts(messages: Sequence[Mapping[str, Any]], n_images: int) -> list[dict[str, Any]]:
    """``messages`` showing ``n_images`` images: kept when the chat has that many image parts, else
    (it has none) one ``{"type": "image"}`` part per image at the start of the first user turn.
    ConfigError for a chat with another number of image parts, or without a user turn."""
    out = [dict(m) for m in messages]
    have = _count_image_parts(out)
    if have == n_images:
        return out
    if have:
        raise ConfigError(f"the chat has {have} image parts but {n_images} images come with it")
    for message in out:
        if message.get("role") == "user":
            content = message.get("content")
            text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            message["content"] = [*({"type": "image"} for _ in range(n_images)), *text]
            return out
    raise ConfigError("the chat has no user turn to show its images in")


def _multimodal(pixel_values: Any, image_grid_thw: Any) -> dict[str, Any]:
    return {
        "pixel_values": pixel_values.float().contiguous(),
        "image_grid_thw": image_grid_thw.long().contiguous(),
    }


def render_vision_prompt(
    processor: VisionProcessor, messages: Sequence[Mapping[str, Any]], images: Sequence[Any]
) -> tuple[list[int], dict[str, Any]]:
    """``(input_ids, multimodal)`` of ``messages`` (with their image parts) and the assistant header."""
    try:
        inputs = processor.encode(processor.render([dict(m) for m in messages], add_generation_prompt=True), images)
    except ModelError as exc:
        raise ConfigError(f"cannot render the prompt's images: {exc}") from exc
    return [int(t) for t in inputs.input_ids], _multimodal(inputs.pixel_values, inputs.image_grid_thw)


def render_vision_transcript(
    processor: VisionProcessor, messages: Sequence[Mapping[str, Any]], images: Sequence[Any]
) -> tuple[list[int], list[int], dict[str, Any]]:
    """``(input_ids, assistant_mask, multimodal)`` of a whole chat with images (see the module docstring)."""
    from areal_tasks.models.vision_processor import image_token_counts

    chat = [dict(m) for m in messages]
    rendered = processor.tokenizer.apply_chat_template(
        chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    short_ids = [int(t) for t in rendered["input_ids"]]
    short_mask = [int(m) for m in rendered["assistant_masks"]]
    if len(short_mask) != len(short_ids) or not any(short_mask):
        raise ConfigError(
            "the chat template marks no assistant tokens; it needs a {% generation %} block around the "
            "assistant content for SFT loss masking"
        )
    pixel_values, grid = processor.pixels(images)
    widths = image_token_counts(grid, processor.merge_size)
    pad = processor.image_token_id
    n_pads = sum(1 for t in short_ids if t == pad)
    if n_pads != len(widths):
        raise ConfigError(f"the chat renders {n_pads} image placeholder(s) for {len(widths)} image(s)")
    ids: list[int] = []
    mask: list[int] = []
    pads_seen = 0
    for token, trained in zip(short_ids, short_mask):
        width = widths[pads_seen] if token == pad else 1
        pads_seen += token == pad
        ids.extend([token] * width)
        mask.extend([0 if token == pad else trained] * width)
    expanded = processor.encode(processor.render(chat, add_generation_prompt=False), images).input_ids
    if ids != [int(t) for t in expanded]:
        raise ConfigError(
            "the chat template's tokens (with the assistant mask) differ from the rendered text's tokens; "
            "the template must render the same text both ways"
        )
    return ids, mask, _multimodal(pixel_values, grid)
