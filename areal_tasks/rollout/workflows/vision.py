"""Vision RLVR: one prompt with images, one generated answer, one verifiable reward.

:class:`VisionRLVRWorkflow` (``vision``) is :class:`~areal_tasks.rollout.workflows.rlvr.RLVRWorkflow`
for items that carry images (a :class:`~areal_tasks.datasets.registry.Record`'s ``images``, or an
``images`` attribute or key). The user turn shows one ``{"type": "image"}`` part per image before
the prompt text (a chat item's own image parts are kept; a chat without any gets them at the start
of its first user turn). The chat is rendered through the model's
:class:`~areal_tasks.models.vision_processor.VisionProcessor` (its tokenizer and image processor),
which expands each image's placeholder to its token count and computes the pixel values and grid
sizes (:func:`~areal_tasks.datasets.vision_prompts.render_vision_prompt`). The request carries the
expanded ``input_ids`` and the images as base64 PNG in ``ModelRequest.image_data``; the
:class:`~areal_tasks.api.workflow.Trajectory` gets ``multimodal={"pixel_values": [P, D] float32,
"image_grid_thw": [N, 3] int64}``, exactly as the processor computed them for this sample, so the
train engine sees what the server saw.

A generated image placeholder token (the policy may sample one; a placeholder the processor did
not put there has no image behind it, and no engine can train the sequence) ends the output: the
tokens before it are kept and scored, the placeholder and what follows are dropped
(``metadata["cut_at_placeholder"]``), as a length limit would cut them.

A GRPO group's episodes share one item, so a :class:`~areal_tasks.datasets.registry.Record` (frozen)
is rendered once for its group: the last rendered records are kept by identity, at most
:data:`RENDER_MEMO` of them and :data:`RENDER_MEMO_BYTES` of their tensors and encoded images (the
processor's work and the PNG encoding run on the rollout's event loop; for a 448x448 image they
take milliseconds an episode; a real processor's pixel values of such an image are about 4.8 MB,
so the byte bound is what holds with large images). The record last rendered is always kept. Other
items are rendered for every episode.

Items without images are rendered as ``rlvr`` renders them (through the tokenizer's chat template),
and their trajectories have no ``multimodal``: one job may mix both. The processor is loaded on the
first item with images: the processor of ``options.processor`` (a model directory) when set, else
the tokenizer with the image processor of the directory it was loaded from (``name_or_path``); a
``VisionProcessor`` passed as the tokenizer is used as is.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from areal_tasks.api.inference import InferenceEngine, ModelRequest, ModelResponse, SamplingParams
from areal_tasks.api.workflow import Trajectory
from areal_tasks.datasets.images import image_list
from areal_tasks.datasets.prompts import SYSTEM_PROMPT, chat_messages
from areal_tasks.datasets.registry import Record
from areal_tasks.datasets.vision_prompts import load_processor, render_vision_prompt, with_image_parts
from areal_tasks.models.vision_processor import encode_image
from areal_tasks.rollout.workflows.rlvr import RewardFn, RLVRWorkflow, item_fields, response_metadata, reward_extras
from areal_tasks.rollout.workflows.tokens import TrajectoryBuilder
from areal_tasks.trace.sessions import note_rejection

logger = logging.getLogger(__name__)

__all__ = ["RenderedPrompt", "VisionRLVROptions", "VisionRLVRWorkflow", "cut_at_placeholders", "item_images"]

#: the video placeholder token of Qwen2-VL-style tokenizers (never in a prompt here: no video).
VIDEO_PAD = "<|video_pad|>"
#: rendered records kept by identity (more than the groups a rollout runs at once) ...
RENDER_MEMO = 256
#: ... and at most this many bytes of their tensors and encoded images (the latest always kept).
RENDER_MEMO_BYTES = 256 * 2**20


@dataclass(frozen=True)
class VisionRLVROptions:
    """``rollout.workflow.options`` of ``vision``."""

    #: the model directory whose processor (tokenizer and image processor) renders prompts with images;
    #: None = the directory the tokenizer was loaded from.
    processor: str | None = None


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt ready to send: expanded token ids, the images' wire form and the processor's tensors."""

    input_ids: list[int]
    #: base64 PNG per image (``ModelRequest.image_data``); empty for a text prompt.
    image_data: list[str]
    #: ``{"pixel_values", "image_grid_thw"}`` tensors, or None for a text prompt.
    multimodal: dict[str, Any] | None

    @property
    def nbytes(self) -> int:
        """Bytes its tensors (or arrays) and encoded images hold (the token ids left out)."""
        held = sum(len(image) for image in self.image_data)
        for value in (self.multimodal or {}).values():
            if hasattr(value, "nbytes"):  # numpy arrays
                held += int(value.nbytes)
            elif hasattr(value, "element_size"):  # torch tensors
                held += value.element_size() * value.nelement()
        return held


def cut_at_placeholders(response: ModelResponse, placeholders: frozenset[int]) -> ModelResponse:
    """``response`` with its output ending before the first token of ``placeholders`` (the same
    response when it has none; a cut one stops by ``length``)."""
    cut = next((i for i, t in enumerate(response.output_ids) if t in placeholders), None)
    if cut is None:
        return response
    return replace(
        response,
        output_ids=response.output_ids[:cut],
        output_logprobs=response.output_logprobs[:cut],
        output_versions=response.output_versions[:cut],
        stop_reason="length",
    )


def item_images(data: Any) -> tuple[Any, ...]:
    """The RGB images of a dataset item (its ``images`` attribute or key; none when it has neither)."""
    value = data.get("images") if isinstance(data, Mapping) else getattr(data, "images", None)
    if value is None or (isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and not value):
        return ()
    return image_list(value, "workflow item")


class VisionRLVRWorkflow(RLVRWorkflow):
    """Single-turn generation from a prompt with images, scored by a verifiable reward."""

    #: the workflow's options (``rollout.workflow.options``): a dataclass, checked before the job starts.
    options_class: ClassVar[type] = VisionRLVROptions

    def __init__(
        self,
        tokenizer: Any,
        sampling: SamplingParams,
        reward: RewardFn,
        *,
        processor: str | None = None,
        system_prompt: str | None = SYSTEM_PROMPT,
        max_prompt_len: int | None = None,
    ) -> None:
        # a processor passed as the tokenizer renders text through its own tokenizer
        text_tokenizer = tokenizer.tokenizer if hasattr(tokenizer, "image_processor") else tokenizer
        super().__init__(
            text_tokenizer,
            sampling,
            reward,
            system_prompt=system_prompt,
            max_prompt_len=max_prompt_len,
        )
        self.processor_source = processor
        self._given = tokenizer
        self._processor: Any = None
        self._rendered: OrderedDict[int, tuple[Record, RenderedPrompt]] = OrderedDict()
        self._rendered_lock = threading.Lock()
        self._rendered_bytes = 0

    @property
    def processor(self) -> Any:
        """The processor (loaded on first use; see :func:`load_processor`)."""
        if self._processor is None:
            self._processor = load_processor(self._given, self.processor_source)
        return self._processor

    def placeholder_ids(self) -> frozenset[int]:
        """The model's image (and video) placeholder token ids, which a generated output must not hold."""
        processor = self.processor
        ids = {processor.image_token_id}
        video = processor.tokenizer.convert_tokens_to_ids(VIDEO_PAD)
        if isinstance(video, int) and video != processor.tokenizer.unk_token_id:
            ids.add(video)
        return frozenset(ids)

    def item_messages(self, data: Any, n_images: int) -> list[dict[str, Any]]:
        """The item's chat (its ``messages``, or its prompt as a user turn) with the system prompt and
        ``n_images`` image parts."""
        messages = data.get("messages") if isinstance(data, Mapping) else getattr(data, "messages", None)
        if not messages:
            prompt, _ = item_fields(data)
            messages = [{"role": "user", "content": prompt}]
        return with_image_parts(chat_messages(messages, self.system_prompt), n_images)

    def render_multimodal(self, data: Any) -> RenderedPrompt:
        """The item's prompt: through the processor when it has images, else as ``rlvr`` renders it
        (a record rendered lately is not rendered again; see the module doc)."""
        if not isinstance(data, Record):
            return self._render(data)
        with self._rendered_lock:
            kept = self._rendered.get(id(data))
            if kept is not None and kept[0] is data:
                self._rendered.move_to_end(id(data))
                return kept[1]
        rendered = self._render(data)
        with self._rendered_lock:
            replaced = self._rendered.pop(id(data), None)
            if replaced is not None:
                self._rendered_bytes -= replaced[1].nbytes
            self._rendered[id(data)] = (data, rendered)  # the record is held: its id stays its own
            self._rendered_bytes += rendered.nbytes
            while len(self._rendered) > 1 and (
                len(self._rendered) > RENDER_MEMO or self._rendered_bytes > RENDER_MEMO_BYTES
            ):
                self._rendered_bytes -= self._rendered.popitem(last=False)[1][1].nbytes
        return rendered

    def _render(self, data: Any) -> RenderedPrompt:
        images = item_images(data)
        if not images:
            return RenderedPrompt(RLVRWorkflow.render_item(self, data), [], None)
        ids, multimodal = render_vision_prompt(self.processor, self.item_messages(data, len(images)), images)
        return RenderedPrompt(ids, [encode_image(image) for image in images], multimodal)

    def render_item(self, data: Any) -> list[int]:
        """Prompt token ids of a dataset item, image placeholders expanded (what ``max_prompt_len`` counts)."""
        return self.render_multimodal(data).input_ids

    async def arun_episode(self, engine: InferenceEngine, data: Any) -> Trajectory | None:
        """Render (with the images), generate once, score; ``None`` for a too-long prompt or an empty output."""
        _, answer = item_fields(data)
        rendered = self.render_multimodal(data)
        if not self.prompt_fits(rendered.input_ids):
            return None
        request = ModelRequest(list(rendered.input_ids), self.sampling, image_data=tuple(rendered.image_data))
        response = await engine.agenerate(request)
        cut = response
        if rendered.image_data or self._processor is not None:  # a vision-language model's output
            cut = cut_at_placeholders(response, self.placeholder_ids())
        if not cut.output_ids:
            logger.debug("rejecting an empty generation (stop_reason=%s)", response.stop_reason)
            note_rejection("empty output")
            return None
        completion = self.decode(cut.output_ids)
        reward = float(await self.reward(completion, answer, **reward_extras(data)))
        builder = TrajectoryBuilder(rendered.input_ids)
        builder.add_generated(cut)
        metadata = {
            **response_metadata(cut, completion),
            "answer": answer,
            "turns": 1,
            "n_images": len(rendered.image_data),
            "cut_at_placeholder": cut is not response,
        }
        trajectory = builder.build(reward, metadata)
        # a dict of its own (the group's episodes share the rendered prompt; the tensors are only read)
        trajectory.multimodal = None if rendered.multimodal is None else dict(rendered.multimodal)
        return trajectory
