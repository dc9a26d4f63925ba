"""``ModelInfo``: what the system needs to know about a model, derived from its ``config.json``.

:func:`model_info_from_config` is a pure function of the parsed config dict (no file system, no
torch), so it is cheap to unit-test with synthetic configs; ``detect.py`` finds the config.
Unknown families are not an error: they are reported as ``unknown`` with a warning and counted as
llama-style dense models (an estimate, said so in ``warnings``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.families import UNKNOWN, family_from_config, traits
from areal_tasks.models.param_count import count_text_parameters, text_shape
from areal_tasks.models.vision_params import vision_parameters

logger = logging.getLogger(__name__)


@dataclass
class ModelInfo:
    """Architecture facts of one model. Sizes refer to the language model (the text part of a VL model).

    ``num_parameters`` includes the vision tower and projector of a VL model when its config is
    present (``num_vision_parameters``); ``num_active_parameters`` counts ``experts_per_token``
    routed experts per MoE layer and equals ``num_parameters`` for dense models.
    """

    family: str
    architecture: str
    model_type: str
    is_moe: bool
    is_vision_language: bool
    num_parameters: int
    num_active_parameters: int
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    context_length: int | None
    tie_word_embeddings: bool
    num_experts: int = 0
    experts_per_token: int = 0
    torch_dtype: str | None = None
    num_vision_parameters: int = 0
    source: str = ""
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language-model part of ``config``: ``text_config`` when nested, else the top level."""
    nested = config.get("text_config")
    if not isinstance(nested, dict):
        return config
    text = dict(nested)
    for key in ("tie_word_embeddings", "vocab_size", "torch_dtype", "dtype"):
        if key not in text and key in config:
            text[key] = config[key]
    return text


def _text_family(family: str, config: dict[str, Any], text: dict[str, Any]) -> str:
    if text is config:
        return family
    nested_family = family_from_config(text)
    if nested_family != UNKNOWN and not traits(nested_family).is_vision_language:
        return nested_family
    return traits(family).text_type or family


def _dtype(text: dict[str, Any], config: dict[str, Any]) -> str | None:
    for source in (config, text):
        for key in ("torch_dtype", "dtype"):
            if isinstance(source.get(key), str):
                return str(source[key])
    return None


def model_info_from_config(config: dict[str, Any], source: str = "config.json") -> ModelInfo:
    """Describe the model whose parsed ``config.json`` is ``config``.

    Raises :class:`ModelError` (naming ``source``) when the config lacks the sizes every decoder has.
    """
    if not isinstance(config, dict):
        raise ModelError(f"{source}: config.json must hold a JSON object, got {type(config).__name__}")
    family = family_from_config(config)
    warnings: list[str] = []
    if family == UNKNOWN:
        message = (
            f"{source}: unknown model family (model_type={config.get('model_type')!r}, "
            f"architectures={config.get('architectures')!r}); sizes are read from the usual keys and the "
            "parameter count assumes a llama-style dense decoder, so treat it as an estimate"
        )
        logger.warning("%s", message)
        warnings.append(message)
    text = _text_config(config)
    text_family = _text_family(family, config, text)
    shape = text_shape(text_family, text, source)
    total, active = count_text_parameters(shape)
    is_vl = traits(family).is_vision_language or isinstance(config.get("vision_config"), dict)
    vision = 0
    if is_vl:
        counted = vision_parameters(family, config, shape.hidden_size)
        if counted is None:
            message = f"{source}: vision tower of {family!r} not recognised; num_parameters counts the text part only"
            logger.warning("%s", message)
            warnings.append(message)
        else:
            vision = counted
    architectures = config.get("architectures") or []
    return ModelInfo(
        family=family,
        architecture=str(architectures[0]) if architectures else "",
        model_type=str(config.get("model_type") or ""),
        is_moe=shape.num_experts > 0,
        is_vision_language=is_vl,
        num_parameters=total + vision,
        num_active_parameters=active + vision,
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate_size,
        context_length=shape.context_length,
        tie_word_embeddings=shape.tie_word_embeddings,
        num_experts=shape.num_experts,
        experts_per_token=shape.experts_per_token,
        torch_dtype=_dtype(text, config),
        num_vision_parameters=vision,
        source=source,
        warnings=warnings,
    )
