"""The SFT warm start's data: demonstrations of the train split, tokenized once, packed per step.

:func:`build_sft_set` turns the job's train split into demonstrations (``datasets/sft.py``: partly
wrong answers) and renders each through the chat template: text demonstrations with the tokenizer
(``render_messages``), demonstrations with images through the model's
:class:`~areal_tasks.models.vision_processor.VisionProcessor`
(:func:`~areal_tasks.datasets.vision_prompts.render_vision_transcript`: image placeholders expanded,
never trained). Prompts over ``dataset.max_prompt_len`` (image tokens included) are dropped, as
RL drops them. :meth:`SFTSet.batch` packs the transcripts a step picks, with their images as the
batch's image keys (``pixel_values``, ``image_grid_thw``, ``seq_n_images``) when the set has images.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.datasets.prompts import render_messages, render_prompt
from areal_tasks.datasets.registry import default_system_prompt, load_split, wrong_fraction
from areal_tasks.datasets.sft import Demonstration, build_demonstrations
from areal_tasks.errors import ConfigError
from areal_tasks.trainer.sft_data import Transcript, pack_transcripts

if TYPE_CHECKING:
    import torch

    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = ["SFTSet", "build_sft_set"]


@dataclass(frozen=True)
class SFTSet:
    """Tokenized demonstrations: ``transcripts`` (ids, assistant mask) and, for a set with images, each
    transcript's ``{"pixel_values", "image_grid_thw"}`` (None for a transcript without images)."""

    transcripts: list[Transcript]
    images: list[dict[str, Any] | None] | None = None

    def __len__(self) -> int:
        return len(self.transcripts)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The packed batch of the transcripts at ``indices`` (with their images, if the set has any)."""
        picked = [self.transcripts[i] for i in indices]
        if self.images is None:
            return pack_transcripts(picked)
        return pack_transcripts(picked, images=[self.images[i] for i in indices])


def _prompt_len(mask: Sequence[int]) -> int:
    """Tokens before the first trained one: the prompt and the assistant header."""
    return next((i for i, m in enumerate(mask) if m), len(mask))


def build_sft_set(cfg: JobConfig, tokenizer: Any) -> SFTSet:
    """The tokenized SFT demonstrations of the train split (see the module docstring); the loss mask
    covers every assistant turn (tool calls included)."""
    records = load_split(cfg.dataset, "train")
    demos = build_demonstrations(records, wrong_fraction(cfg.dataset.path), seed=cfg.experiment.seed)
    configured = cfg.rollout.workflow.system_prompt  # the prompt RL and evaluation render too
    system = default_system_prompt(cfg.dataset.path) if configured is None else configured
    limit = cfg.dataset.max_prompt_len
    if any(demo.images for demo in demos):
        built = _vision_set(demos, tokenizer, system, limit)
    else:
        transcripts = [
            render_messages(tokenizer, demo.messages(system), demo.tools)
            for demo in demos
            if len(render_prompt(tokenizer, demo.prompt, system, demo.tools)) <= limit
        ]
        built = SFTSet(transcripts)
    if not built.transcripts:
        raise ConfigError(f"dataset.max_prompt_len={limit} drops every training prompt")
    logger.info("SFT: %d transcripts (%d dropped as too long)", len(built), len(demos) - len(built))
    return built


def _vision_set(demos: Sequence[Demonstration], tokenizer: Any, system: str | None, limit: int) -> SFTSet:
    from areal_tasks.datasets.vision_prompts import load_processor, render_vision_transcript

    processor = load_processor(tokenizer)
    transcripts: list[Transcript] = []
    images: list[dict[str, Any] | None] = []
    for demo in demos:
        messages = demo.messages(system)
        if demo.images:
            ids, mask, multimodal = render_vision_transcript(processor, messages, demo.images)
        else:
            (ids, mask), multimodal = render_messages(processor.tokenizer, messages, demo.tools), None
        if _prompt_len(mask) > limit:
            continue
        transcripts.append((ids, mask))
        images.append(multimodal)
    return SFTSet(transcripts, images)
