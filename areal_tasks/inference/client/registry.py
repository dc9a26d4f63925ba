"""Backend name -> protocol adapter. Adapters are imported on first use, so a backend's module
(e.g. vLLM's) is only loaded when that backend is chosen."""

from __future__ import annotations

import importlib
import logging
from typing import Any

from areal_tasks.errors import ConfigError
from areal_tasks.inference.client.protocol import ProtocolAdapter

logger = logging.getLogger(__name__)

__all__ = ["adapter_names", "make_adapter", "register_adapter"]

_ADAPTERS: dict[str, str | type[ProtocolAdapter]] = {
    "sglang": "areal_tasks.inference.client.sglang:SGLangAdapter",
    "embedded": "areal_tasks.inference.client.embedded:EmbeddedAdapter",
    "vllm": "areal_tasks.inference.client.vllm:VLLMAdapter",
}


def adapter_names() -> list[str]:
    """Backends that have an adapter."""
    return sorted(_ADAPTERS)


def register_adapter(name: str, adapter: str | type[ProtocolAdapter]) -> None:
    """Register (or replace) the adapter of backend ``name``: a class or ``"module:Class"``."""
    _ADAPTERS[name] = adapter


def make_adapter(name: str, **kwargs: Any) -> ProtocolAdapter:
    """An adapter instance for backend ``name``; ``kwargs`` go to its constructor."""
    try:
        target = _ADAPTERS[name]
    except KeyError:
        raise ConfigError(f"inference backend {name!r} has no client adapter; known: {adapter_names()}") from None
    if isinstance(target, str):
        module_name, _, class_name = target.partition(":")
        target = getattr(importlib.import_module(module_name), class_name)
    return target(**kwargs)
