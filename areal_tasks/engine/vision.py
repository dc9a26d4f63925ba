"""Vision-language models in the train engine (Qwen2-VL, Qwen2.5-VL): recognising them, how they
load, and the model inputs of a packed micro-batch with images.

Loading. A VLM loads with ``AutoModelForImageTextToText`` (``Qwen2VLForConditionalGeneration``...),
its language model with the engine's attention and its vision tower with ``sdpa``: transformers
passes the forward's keyword arguments on to the vision tower, so the packed text bounds
(``cu_seq_lens_q``...) reach the vision attention too. ``sdpa`` ignores them and attends within
each image (the tower splits its patches per image); the engine's packed attention would apply
them (causally, at the text bounds) and flash-attention would receive them twice. The vision
tower trains with the rest (LoRA freezes it with every other base weight).

Positions. Qwen2-VL's rotary embedding takes 3-D (temporal, height, width) positions: image tokens
follow the image's grid, text tokens count on after it. :meth:`VLMInputs.position_ids` computes
them with the model's own ``get_rope_index`` for every sequence separately (each restarts at 0, as
a per-sequence forward would) and concatenates them; transformers' packed form ``[4, 1, T]`` puts
the plain per-sequence text positions first (what a packing-aware attention reads), then the three
rotary rows.

Dummy image. Under FSDP with more than one rank, every rank's backward must reduce the gradients
of the same parameters: a micro-batch without images would leave a trained vision tower without
gradients on one rank while another rank has them. :meth:`VLMInputs.with_dummy_image` appends a
one-token sequence holding a blank image of the smallest grid; its scores are cut off again, so it
adds zero to every gradient and nothing to the outputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.api.batch import (
    CU_SEQLENS,
    IMAGE_GRID_THW,
    INPUT_IDS,
    PIXEL_VALUES,
    POSITION_IDS,
    SEQ_N_IMAGES,
)
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

__all__ = [
    "VISION_MODEL_TYPES",
    "VLMInputs",
    "is_vision_language",
    "load_vision_language",
    "model_problems",
    "vision_tower_trains",
    "with_vision_tower",
]

#: the vision-language ``model_type`` values the engine trains.
VISION_MODEL_TYPES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")

#: the vision tower's attention (module docstring: why not the engine's).
VISION_ATTN = "sdpa"


def is_vision_language(hf_config: Any) -> bool:
    """Whether ``hf_config`` (a transformers config) is a VLM the engine trains; EngineError for a
    config with a vision tower of another family (it would load without its images)."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type in VISION_MODEL_TYPES:
        return True
    if getattr(hf_config, "vision_config", None) is not None:
        raise EngineError(
            f"model_type {model_type!r} has a vision tower, which the train engine does not support; "
            f"supported vision-language families: {', '.join(VISION_MODEL_TYPES)}"
        )
    return False


def model_problems(hf_config: Mapping[str, Any], dims: Any, config: Any) -> list[str]:
    """Why the FSDP engine cannot run the model whose ``config.json`` is ``hf_config`` at ``dims``
    (``ParallelDims``) with ``config`` (``EngineConfig``): the engine registry's check, before a job
    starts. Text models: nothing; vision-language ones: data parallelism only, no value head."""
    model_type = hf_config.get("model_type")
    if model_type not in VISION_MODEL_TYPES:
        if "vision_config" in hf_config:
            return [
                f"model_type {model_type!r} has a vision tower; the fsdp engine trains the vision-language "
                f"families {', '.join(VISION_MODEL_TYPES)}"
            ]
        return []
    problems = [
        f"{letter}{size} ({word}) is not supported for a vision-language model ({model_type}): it trains "
        "with data parallelism (d) only"
        for letter, word, size in (("t", "tensor parallelism", dims.tp), ("c", "sequence parallelism", dims.sp))
        if size > 1
    ]
    if getattr(config, "value_head", False):
        problems.append(f"a value head (critic) on a vision-language model ({model_type}) is not supported")
    return problems


def load_vision_language(path: str, attn: str, dtype: torch.dtype) -> torch.nn.Module:
    """The VLM at ``path`` (``AutoModelForImageTextToText``), its language model with ``attn``."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(
        path, dtype=dtype, attn_implementation={"text_config": attn, "vision_config": VISION_ATTN}
    )


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers ``...ForConditionalGeneration`` under a peft wrapper (or ``model`` itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def vision_tower_trains(model: torch.nn.Module) -> bool:
    """Whether any parameter of a VLM's vision tower takes gradients (not with LoRA's defaults)."""
    return any(p.requires_grad for p in _base_model(model).model.visual.parameters())


def freeze_vision_tower(model: torch.nn.Module, path: str) -> None:
    """``engine.freeze_vision``: no gradients for the vision tower (EngineError for a text model)."""
    if not hasattr(_base_model(model), "model") or not hasattr(_base_model(model).model, "visual"):
        raise EngineError(f"engine.freeze_vision is set, but {path} has no vision tower; unset it for a text model")
    _base_model(model).model.visual.requires_grad_(False)


def with_vision_tower(estimate: Any, model: torch.nn.Module) -> Any:
    """``estimate`` (a :class:`~areal_tasks.models.memory.MemoryEstimate` of the language model) with
    a VLM's vision tower added to its static bytes, sharded like the rest: parameters (and the
    published copy) grow with the tower's parameters, gradients and optimizer state with its trained
    ones. The tower's activations stay uncounted, as the estimate's own docstring says."""
    import dataclasses

    tower = list(_base_model(model).model.visual.parameters())
    n_tower = sum(p.numel() for p in tower)  # a DTensor counts its global size
    n_trained = sum(p.numel() for p in tower if p.requires_grad)
    grow = (estimate.num_params + n_tower) / estimate.num_params
    grow_trained = (estimate.num_trainable_params + n_trained) / max(estimate.num_trainable_params, 1)
    return dataclasses.replace(
        estimate,
        num_params=estimate.num_params + n_tower,
        num_trainable_params=estimate.num_trainable_params + n_trained,
        param_bytes=round(estimate.param_bytes * grow),
        grad_bytes=round(estimate.grad_bytes * grow_trained),
        optimizer_bytes=round(estimate.optimizer_bytes * grow_trained),
        publish_buffer_bytes=round(estimate.publish_buffer_bytes * grow),
    )


@dataclass(frozen=True)
class VLMInputs:
    """What the forward needs to feed one VLM: the image token, the merge size, the patch width, and
    the model's own 3-D position function (``Qwen2VLModel.get_rope_index``)."""

    image_token_id: int
    spatial_merge_size: int
    #: columns of a ``pixel_values`` row: channels x temporal patch x patch x patch.
    patch_dim: int
    rope_index: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def of_model(cls, model: torch.nn.Module) -> VLMInputs | None:
        """The inputs of ``model`` when it is a supported VLM (possibly peft-wrapped), else None."""
        base = _base_model(model)
        config = getattr(base, "config", None)
        if config is None or not is_vision_language(config):
            return None
        vision = config.vision_config
        patch_dim = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
        return cls(
            image_token_id=int(config.image_token_id),
            spatial_merge_size=int(vision.spatial_merge_size),
            patch_dim=patch_dim,
            rope_index=base.model.get_rope_index,
        )

    def model_inputs(self, mb: dict[str, torch.Tensor], bounds: tuple[int, ...]) -> dict[str, torch.Tensor]:
        """The keyword arguments a packed micro-batch adds to the model call: the ``[4, 1, T]``
        positions, and the images when it holds any."""
        inputs = {POSITION_IDS: self.position_ids(mb, bounds)}
        if IMAGE_GRID_THW in mb and mb[IMAGE_GRID_THW].shape[0] > 0:
            inputs[PIXEL_VALUES] = mb[PIXEL_VALUES]
            inputs[IMAGE_GRID_THW] = mb[IMAGE_GRID_THW]
        return inputs

    def position_ids(self, mb: dict[str, torch.Tensor], bounds: tuple[int, ...]) -> torch.Tensor:
        """``[4, 1, T]``: the per-sequence text positions, then the 3-D rotary positions of every
        sequence computed on its own (computed on the host; a text-only sequence counts 0..L-1)."""
        import torch

        ids = mb[INPUT_IDS]
        host_ids = ids.cpu()
        has_images = IMAGE_GRID_THW in mb
        counts = mb[SEQ_N_IMAGES].cpu().tolist() if has_images else [0] * (len(bounds) - 1)
        grid = mb[IMAGE_GRID_THW].cpu() if has_images else None
        parts, first_image = [], 0
        for i, ((start, end), n) in enumerate(zip(itertools.pairwise(bounds), counts)):
            seq = host_ids[start:end]
            is_image = seq == self.image_token_id
            if n == 0:
                if bool(is_image.any()):
                    raise EngineError(
                        f"sequence {i} of the micro-batch has {int(is_image.sum())} image tokens but no image "
                        f"({SEQ_N_IMAGES} is 0); pack its images with it"
                    )
                parts.append(torch.arange(end - start).view(1, 1, -1).expand(3, 1, -1))
                continue
            images = grid[first_image : first_image + n]
            first_image += n
            self._check_image_tokens(i, int(is_image.sum()), images)
            positions, _ = self.rope_index(
                seq.unsqueeze(0), mm_token_type_ids=is_image.to(torch.int).unsqueeze(0), image_grid_thw=images
            )
            parts.append(positions)
        rotary = torch.cat(parts, dim=2)
        text = mb[POSITION_IDS].cpu().view(1, 1, -1)
        return torch.cat([text, rotary], dim=0).to(ids.device)

    def _check_image_tokens(self, seq: int, n_tokens: int, grid: torch.Tensor) -> None:
        expected = int(grid.prod(-1).sum()) // self.spatial_merge_size**2
        if n_tokens != expected:
            raise EngineError(
                f"sequence {seq} of the micro-batch has {n_tokens} image tokens, but its {grid.shape[0]} images "
                f"need {expected} (prod(image_grid_thw) / {self.spatial_merge_size}**2 each): input_ids must "
                "carry every image's placeholder expanded, as the processor writes them"
            )

    def needs_dummy_image(self, mb: dict[str, torch.Tensor]) -> bool:
        """Whether ``mb`` holds no image (so the vision tower would get no gradient)."""
        return IMAGE_GRID_THW not in mb or mb[IMAGE_GRID_THW].shape[0] == 0

    def with_dummy_image(
        self, mb: dict[str, torch.Tensor], bounds: tuple[int, ...]
    ) -> tuple[dict[str, torch.Tensor], tuple[int, ...]]:
        """``mb`` (and its host bounds) with one more sequence: a single image token and a blank
        image of grid ``(1, m, m)`` (``m`` the merge size). For a micro-batch without images
        (:meth:`needs_dummy_image`); only the keys the forward reads are kept. Cut the outputs
        back to ``mb``'s tokens."""
        import torch

        ids, cu = mb[INPUT_IDS], mb[CU_SEQLENS]
        total = ids.shape[0]
        m = self.spatial_merge_size
        pixels = mb.get(PIXEL_VALUES)
        dtype = pixels.dtype if pixels is not None else torch.float32
        counts = mb[SEQ_N_IMAGES] if SEQ_N_IMAGES in mb else torch.zeros(len(bounds) - 1, dtype=torch.long)
        out = {
            INPUT_IDS: torch.cat([ids, ids.new_full((1,), self.image_token_id)]),
            POSITION_IDS: torch.cat([mb[POSITION_IDS], mb[POSITION_IDS].new_zeros(1)]),
            CU_SEQLENS: torch.cat([cu, cu.new_full((1,), total + 1)]),
            PIXEL_VALUES: torch.zeros(m * m, self.patch_dim, dtype=dtype, device=ids.device),
            IMAGE_GRID_THW: torch.tensor([[1, m, m]], dtype=torch.long, device=ids.device),
            SEQ_N_IMAGES: torch.cat([counts.to(ids.device), counts.new_ones(1).to(ids.device)]),
        }
        return out, (*bounds, total + 1)
