"""Models: architecture detection, layout recommendation, tokenizer loading, LoRA and the tiny-model kit.

Importing this package is torch-free (transformers, peft and torch are imported inside the
functions that need them), so DAG-side pre-flight checks can call :func:`detect_model` and
:func:`recommend_layout` cheaply.
"""

from __future__ import annotations

from areal_tasks.models.detect import detect_model
from areal_tasks.models.families import FAMILIES, UNKNOWN, family_from_config
from areal_tasks.models.info import ModelInfo, model_info_from_config
from areal_tasks.models.layout import LayoutRecommendation, recommend_layout
from areal_tasks.models.lora import build_lora_config, lora_target_modules
from areal_tasks.models.tiny.kit import TINY_FAMILIES, build_tiny_model
from areal_tasks.models.tiny.tokenizer_kit import build_tiny_tokenizer
from areal_tasks.models.tokenizer import load_tokenizer

__all__ = [
    "FAMILIES",
    "TINY_FAMILIES",
    "UNKNOWN",
    "LayoutRecommendation",
    "ModelInfo",
    "build_lora_config",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "detect_model",
    "family_from_config",
    "load_tokenizer",
    "lora_target_modules",
    "model_info_from_config",
    "recommend_layout",
]
