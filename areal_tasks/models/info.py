"""``ModelInfo``: what detection reports about a model, derived from its ``config.json``.

:func:`model_info_from_config` is a pure function of the parsed config dict (no file system, no
torch), so it is cheap to unit-test with synthetic configs; ``detect.py`` finds the config. The
model's sizes are one :class:`~areal_tasks.models.dims.ModelDims` (``info.dims``); the report adds
what detection knows besides: the family and architecture named in the config, parameter counts
including a vision tower, the dtype, where the config came from and any warnings. Unknown families
are not an error: they are reported as ``unknown`` with a warning and counted as llama-style dense
models (an estimate, said so in ``warnings``).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.dims import ModelDims, text_config, text_family
from areal_tasks.models.families import UNKNOWN, family_from_config, traits
from areal_tasks.models.vision_params import vision_parameters

logger = logging.getLogger(__name__)


@dataclass
class ModelInfo:
    """Detection's report on one model; its sizes are ``dims`` (the language model of a VL model).

    ``num_parameters`` includes the vision tower and projector of a VL model when its config is
    present (``num_vision_parameters``); ``num_active_parameters`` counts ``experts_per_token``
    routed experts per MoE layer and equals ``num_parameters`` for dense models.
    """

    family: str
    architecture: str
    model_type: str
    is_vision_language: bool
    num_parameters: int
    num_active_parameters: int
    dims: ModelDims
    torch_dtype: str | None = None
    num_vision_parameters: int = 0
    source: str = ""
    warnings: list[str] = field(default_factory=list)

    @property
    def is_moe(self) -> bool:
        return self.dims.is_moe

    def to_dict(self) -> dict[str, Any]:
        """A flat JSON-ready dict: the report's fields, ``is_moe`` and the dims' fields (the dims'
        own ``family``, the text family, as ``text_family``)."""
        report = asdict(self)
        dims = report.pop("dims")
        dims["text_family"] = dims.pop("family")
        return {**report, "is_moe": self.is_moe, **dims}


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
    text = text_config(config)
    dims = ModelDims.from_text_config(text_family(config, text), text, source)
    is_vl = traits(family).is_vision_language or isinstance(config.get("vision_config"), dict)
    vision = 0
    if is_vl:
        counted = vision_parameters(family, config, dims.hidden_size)
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
        is_vision_language=is_vl,
        num_parameters=dims.num_params + vision,
        num_active_parameters=dims.num_active_params + vision,
        dims=dims,
        torch_dtype=_dtype(text, config),
        num_vision_parameters=vision,
        source=source,
        warnings=warnings,
    )
