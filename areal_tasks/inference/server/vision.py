"""A prompt's images made ready for a vision-language model (Qwen2-VL, Qwen2.5-VL).

:class:`VisionPreparer` runs once per request at admission, off the engine loop (the ``tokenize``
lane): it decodes and checks the images (``images.py``), runs the model's image processor
(``pixel_values``, ``image_grid_thw``), expands the ``<|image_pad|>`` placeholders of the prompt
when they come one per image (SGLang's form; the processor's already expanded form is taken as
it is) and computes the prompt's multimodal rotary positions with the model's own
``get_rope_index``. An image sent again (a GRPO group's ``n`` requests, a resubmitted partial
rollout, an agent's next turn) is decoded and processed once (``image_cache.py``). The result, a
:class:`VisionPrompt`, travels with the sequence group: the engine runs the vision tower in the
prompt's prefill and every decode step of the sequence rotates at ``text position + rope_delta``
on all three axes, as ``transformers`` generation does. The positions are computed here per
prompt and passed explicitly, never read from the model's cached ``rope_deltas`` (one value for
a whole batch).

The placeholders of a prompt must match its images: runs of ``<|image_pad|>`` of exactly each
image's token count, in order, or exactly one pad per image; anything else is a 400 naming the
count found and the counts expected. So are images sent to a model without a vision tower, and
pads in a prompt without images. One exception: after the expanded runs of all its images, a
prompt may hold more pads, as text: a resubmitted partial rollout is the prompt plus the tokens
sampled so far, and a model may sample a pad. Only the placeholders take image features (the
runner writes them into the prompt's embeddings at :attr:`VisionPrompt.image_tokens`), so such a
token, in a prompt or in a retracted sequence's output, is embedded as the text token it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.image_cache import ProcessedImageCache
from areal_tasks.inference.server.images import DEFAULT_IMAGE_CACHE_MB
from areal_tasks.models.vision_processor import IMAGE_PAD, image_token_counts

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VisionPrompt:
    """What a prompt's prefill needs besides its token ids (see the module doc)."""

    #: [patches, channels x temporal patch x patch x patch], float32 on the CPU, as the processor gives it.
    pixel_values: torch.Tensor
    #: [images, 3]: each image's temporal, height and width patch counts.
    image_grid_thw: torch.Tensor
    #: the prompt indices that take the images' features, in order (the placeholders' pads).
    image_tokens: torch.Tensor
    #: [3, prompt length]: the prompt's rotary positions (temporal, height, width).
    positions: torch.Tensor
    #: a text token after the prompt at index ``i`` rotates at ``i + rope_delta`` on every axis.
    rope_delta: int

    def positions_for(self, length: int) -> torch.Tensor:
        """Rotary positions [3, length] of the prompt followed by ``length - prompt length`` text tokens
        (a retracted sequence's prompt plus its output)."""
        known = self.positions.shape[1]
        if length <= known:
            return self.positions[:, :length]
        extra = torch.arange(known, length, dtype=self.positions.dtype) + self.rope_delta
        return torch.cat([self.positions, extra.view(1, -1).expand(3, -1)], dim=1)


def pad_runs(ids: list[int], pad: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every run of ``pad`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    for i, token in enumerate(ids):
        if token != pad:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def expand_pads(ids: list[int], counts: list[int], pad: int, pad_name: str = IMAGE_PAD) -> tuple[list[int], list[int]]:
    """``ids`` with each image's placeholder run ``counts[i]`` pads long, and the index of every
    image token in them (see the module doc for the forms accepted)."""
    runs = pad_runs(ids, pad)
    lengths = [n for _, n in runs]
    images = len(counts)
    if images and lengths[:images] == counts:  # expanded (pads after the images' runs are text)
        return list(ids), [i for start, n in runs[:images] for i in range(start, start + n)]
    if len(runs) == images and all(n == 1 for n in lengths):  # one pad per image
        out: list[int] = []
        where: list[int] = []
        previous = 0
        for (start, _), count in zip(runs, counts):
            out += ids[previous:start]
            where += range(len(out), len(out) + count)
            out += [pad] * count
            previous = start + 1
        return out + ids[previous:], where
    raise InferenceRequestError(
        f"input_ids hold {sum(lengths)} {pad_name} tokens (runs of {lengths}); the {images} images "
        f"need {sum(counts)} (runs of {counts}, as the processor expands them) or {images} "
        "(one per image, which the server expands)",
        param="input_ids",
    )


class VisionPreparer:
    """Turns ``(input_ids, wire images)`` into the expanded ids and a :class:`VisionPrompt`."""

    def __init__(self, model: Any, image_processor: Any, cache_bytes: int = DEFAULT_IMAGE_CACHE_MB << 20) -> None:
        config = model.config
        self.image_processor = image_processor
        #: the processed images by content (``image_cache.py``): a resent image is processed once.
        self.images = ProcessedImageCache(
            lambda images: image_processor(images=images, return_tensors="pt"), cache_bytes
        )
        self.image_token_id = int(config.image_token_id)
        self.merge = int(config.vision_config.spatial_merge_size)
        self._rope_index = model.model.get_rope_index
        self.pad_name = IMAGE_PAD

    def prepare(
        self, input_ids: list[int], image_data: list[Any], field: str = "image_data"
    ) -> tuple[list[int], VisionPrompt | None]:
        """The prompt's ids with expanded placeholders and its vision inputs (None without images;
        a text prompt must then hold no image placeholder)."""
        if not image_data:
            expand_pads(input_ids, [], self.image_token_id, self.pad_name)
            return list(input_ids), None
        pixel_values, grid = self.images.processed(image_data, field)
        ids, where = expand_pads(input_ids, image_token_counts(grid, self.merge), self.image_token_id, self.pad_name)
        image_tokens = torch.tensor(where, dtype=torch.long)
        token_types = torch.zeros(1, len(ids), dtype=torch.int)
        token_types[0, image_tokens] = 1
        with torch.inference_mode():
            positions, deltas = self._rope_index(torch.tensor([ids]), token_types, image_grid_thw=grid)
        prompt = VisionPrompt(
            pixel_values=pixel_values,
            image_grid_thw=grid,
            image_tokens=image_tokens,
            positions=positions[:, 0].clone(),
            rope_delta=int(deltas.view(-1)[0]),
        )
        return ids, prompt


def refuse_images(field: str = "image_data") -> InferenceRequestError:
    """The 400 for images sent to a model without a vision tower."""
    return InferenceRequestError(
        f"{field}: this server's model has no vision tower and cannot read images; "
        "send text only, or serve a vision-language model (Qwen2-VL, Qwen2.5-VL)",
        param=field,
    )
