"""``tiny:<family>[?key=value&...]`` model references, parsed without importing torch.

``tiny:qwen2?hidden_size=128&num_hidden_layers=2`` names the kit's tiny Qwen2 with those config
overrides (values parsed as int, float or bool where they look like one), so a job YAML can name
exactly the shape it trains, as ``areal model tiny --set KEY=VALUE`` does on the command line.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from areal_tasks.errors import ModelError

TINY_PREFIX = "tiny:"


def parse_value(text: str) -> Any:
    """``"128"`` -> 128, ``"1e-5"`` -> 1e-05, ``"true"`` -> True; anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_tiny_spec(reference: str) -> tuple[str, dict[str, Any]]:
    """``"tiny:qwen2?hidden_size=128"`` -> ``("qwen2", {"hidden_size": 128})``."""
    if not reference.startswith(TINY_PREFIX):
        raise ModelError(f"{reference!r} is not a tiny-model reference (tiny:<family>[?key=value&...])")
    family, _, query = reference[len(TINY_PREFIX) :].strip().partition("?")
    if not family:
        raise ModelError(f"{reference!r}: a tiny model needs a family, e.g. tiny:qwen2")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError as exc:
        raise ModelError(f"{reference!r}: overrides must read key=value&key=value ({exc})") from exc
    return family, {key: parse_value(value) for key, value in pairs}
