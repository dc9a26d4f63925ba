"""Tiny, randomly initialised vision-language models of real architectures (Qwen2-VL, Qwen2.5-VL).

``build_tiny_vlm("qwen2_vl")`` returns a directory that transformers loads like a hub checkpoint:
``AutoModelForImageTextToText`` (``Qwen2VLForConditionalGeneration`` /
``Qwen2_5_VLForConditionalGeneration``), ``AutoProcessor`` (the family's processor: the kit's
tokenizer plus the vision special tokens, and the Qwen2-VL image processor) and ``AutoTokenizer``.

Shape: the language model is the text kit's (hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16,
MLP 128) with multimodal rotary sections ``[2, 3, 3]`` (temporal, height, width halves of head_dim);
the vision tower has 2 blocks of width 32 over 8x8 patches (temporal patch 2), merged 2x2 into one
language token. The image processor resizes images to between 32x32 and 64x64 pixels, so an image
costs 4 to 16 tokens. The vocabulary is the kit tokenizer's 1024 tokens plus
``<|vision_start|>`` 1024, ``<|vision_end|>`` 1025, ``<|image_pad|>`` 1026 and ``<|video_pad|>`` 1027.

The chat template is the text kit's with image parts: a content part of type ``image`` or
``image_url`` renders as ``<|vision_start|><|image_pad|><|vision_end|>``; the processor expands the
pad to the image's token count. Built once per (family, overrides, seed) and cached like the text
models (:mod:`areal_tasks.models.tiny.cache`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.tiny.cache import cache_root, content_hash, deliver, get_or_build
from areal_tasks.models.tiny.tokenizer_kit import (
    BOS_ID,
    ENDOFTEXT,
    EOS_ID,
    PAD_ID,
    SPECIAL_IDS,
    TINY_VOCAB_SIZE,
    build_tiny_tokenizer,
    chat_template,
    tokenizer_cache_key,
)

logger = logging.getLogger(__name__)

VISION_KIT_VERSION = 1
MANIFEST = "areal_tiny.json"
#: the vision-language families the kit builds
VISION_FAMILIES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")

VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS: tuple[str, ...] = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
#: ids of the vision tokens (appended after the text tokenizer's vocabulary)
VISION_IDS: dict[str, int] = {token: TINY_VOCAB_SIZE + i for i, token in enumerate(VISION_TOKENS)}
TINY_VLM_VOCAB_SIZE = TINY_VOCAB_SIZE + len(VISION_TOKENS)

PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 8, 2, 2
MIN_PIXELS, MAX_PIXELS = 32 * 32, 64 * 64

#: the language-model sizes an override may change (the rest of the shape is fixed)
TEXT_SHAPE: dict[str, int] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
}
_TEXT_BOUNDS: dict[str, int] = {
    "hidden_size": 4096,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "intermediate_size": 16_384,
    "max_position_embeddings": 1 << 17,
}

# The text template renders only text parts; the vision template adds image parts.
_TEXT_PART = "{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}"
_VISION_PART = (
    "{%- if part.type == 'text' -%}{{ part.text }}"
    "{%- elif part.type in ['image', 'image_url'] -%}" + VISION_START + IMAGE_PAD + VISION_END + "{%- endif -%}"
)


def vision_chat_template() -> str:
    """The kit's ChatML template with image content parts rendered as vision placeholders."""
    template = chat_template()
    if _TEXT_PART not in template:
        raise ModelError("the tiny chat template changed: its text-part rendering is not where the vision kit expects")
    return template.replace(_TEXT_PART, _VISION_PART)


def _mrope_section(head_dim: int) -> list[int]:
    """Temporal/height/width split of ``head_dim // 2`` rotary frequencies (Qwen's 2:3:3 ratio)."""
    half = head_dim // 2
    temporal = max(1, half // 4)
    height = (half - temporal) // 2
    return [temporal, height, half - temporal - height]


def tiny_vlm_config(family: str, **text_overrides: Any) -> dict[str, Any]:
    """The config kwargs (for the family's transformers config class) of a tiny ``family`` VLM."""
    if family not in VISION_FAMILIES:
        raise ModelError(f"tiny vision family {family!r} is not supported; choose one of {', '.join(VISION_FAMILIES)}")
    unknown = sorted(set(text_overrides) - set(TEXT_SHAPE))
    if unknown:
        raise ModelError(
            f"unknown tiny {family} key(s) {', '.join(unknown)}; a tiny VLM's overrides are {', '.join(TEXT_SHAPE)}"
        )
    text = {**TEXT_SHAPE, **text_overrides}
    problems = [
        f"{key}={value!r} must be an integer in 1..{_TEXT_BOUNDS[key]:,}"
        for key, value in text.items()
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _TEXT_BOUNDS[key]
    ]
    if not problems and text["hidden_size"] % text["num_attention_heads"]:
        problems.append(f"hidden_size={text['hidden_size']} must be a multiple of num_attention_heads")
    if not problems and text["num_attention_heads"] % text["num_key_value_heads"]:
        problems.append("num_attention_heads must be a multiple of num_key_value_heads")
    if not problems and (text["hidden_size"] // text["num_attention_heads"]) % 2:
        problems.append("the head size (hidden_size // num_attention_heads) must be even for rotary embeddings")
    if problems:
        raise ModelError(f"tiny {family} model: {'; '.join(problems)}")
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    text_config = {
        **text,
        "vocab_size": TINY_VLM_VOCAB_SIZE,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope_section(head_dim)},
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }
    vision: dict[str, Any] = {
        "depth": 2,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    }
    if family == "qwen2_vl":
        vision.update(embed_dim=32, mlp_ratio=2, hidden_size=text["hidden_size"])
    else:  # qwen2_5_vl: windowed attention in the first block, full attention in the last
        vision.update(
            hidden_size=32,
            intermediate_size=64,
            out_hidden_size=text["hidden_size"],
            window_size=4 * PATCH_SIZE * MERGE_SIZE // 2,
            fullatt_block_indexes=[1],
        )
    return {
        "text_config": text_config,
        "vision_config": vision,
        "image_token_id": VISION_IDS[IMAGE_PAD],
        "video_token_id": VISION_IDS[VIDEO_PAD],
        "vision_start_token_id": VISION_IDS[VISION_START],
        "vision_end_token_id": VISION_IDS[VISION_END],
        "tie_word_embeddings": False,
    }


def tiny_vlm_key(family: str, seed: int, config: dict[str, Any]) -> str:
    """Cache entry name of one tiny VLM."""
    from importlib import metadata

    payload = {
        "family": family,
        "seed": seed,
        "config": config,
        "kit": VISION_KIT_VERSION,
        "tokenizer": tokenizer_cache_key(),
        "template": vision_chat_template(),
        "transformers": metadata.version("transformers"),
    }
    return f"{family}-s{seed}-{content_hash(payload)}"


def _write_processor(directory: Path, tokenizer_dir: Path) -> None:
    """Tokenizer (with the vision tokens and template), image processor and ``processor_config.json``.

    transformers' ``Qwen2VLProcessor`` cannot be built without torchvision (it checks for a video
    processor), so its files are written piece by piece; where torchvision is installed,
    ``AutoProcessor`` loads them as the family's processor."""
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    added = tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    if added != len(VISION_TOKENS) or ids != VISION_IDS or len(tokenizer) != TINY_VLM_VOCAB_SIZE:
        raise ModelError(f"tiny VLM tokenizer: vision tokens got ids {ids}, expected {VISION_IDS}")
    tokenizer.chat_template = vision_chat_template()
    tokenizer.save_pretrained(str(directory))
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
    )
    image_processor.save_pretrained(str(directory))
    processor_config = {"processor_class": "Qwen2VLProcessor"}
    (directory / "processor_config.json").write_text(json.dumps(processor_config, indent=2), encoding="utf-8")


def _write_vlm(directory: Path, family: str, seed: int, config_kwargs: dict[str, Any], tokenizer_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig

    config = AutoConfig.for_model(family, **config_kwargs)
    config.dtype = "float32"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=[EOS_ID, SPECIAL_IDS[ENDOFTEXT]], pad_token_id=PAD_ID
    )
    model.save_pretrained(str(directory))
    _write_processor(directory, tokenizer_dir)
    manifest = {"family": family, "seed": seed, "config": config_kwargs, "kit_version": VISION_KIT_VERSION}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")


def build_tiny_vlm(
    family: str,
    seed: int = 0,
    out_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    **text_overrides: Any,
) -> Path:
    """Build (or reuse from the cache) a tiny random ``family`` VLM and return its directory.

    ``text_overrides`` change the language model's shape (keys of :data:`TEXT_SHAPE`). With
    ``out_dir`` the files are copied there and ``out_dir`` is returned; otherwise the cache entry
    itself is returned (treat it as read-only).
    """
    from areal_tasks.models.tiny.kit import check_out_dir

    config = tiny_vlm_config(family, **text_overrides)
    target = None if out_dir is None else check_out_dir(out_dir)
    root = cache_root(cache_dir)

    def build(tmp: Path) -> None:
        logger.info("building tiny %s vision-language model (seed %d) under %s", family, seed, root)
        _write_vlm(tmp, family, seed, config, build_tiny_tokenizer(cache_dir))

    cached = get_or_build(root, tiny_vlm_key(family, seed, config), build)
    return deliver(cached, target)
