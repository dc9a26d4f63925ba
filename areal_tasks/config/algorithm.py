"""Algorithm configuration: one small dataclass per RL algorithm, chosen by ``algorithm.name``.

Torch-free. ``AlgorithmConfig`` is a tagged union for the config loader: the loader reads
``name`` first and builds the dataclass that :meth:`AlgorithmConfig.variant_class` returns, so
overrides such as ``algorithm.eps_clip_high=0.28`` are type-checked against the chosen algorithm.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, ClassVar, TypeVar

from areal_tasks.errors import ConfigError

_REGISTRY: dict[str, type["AlgorithmConfig"]] = {}

T = TypeVar("T", bound=type["AlgorithmConfig"])


def register_algorithm_config(name: str) -> Callable[[T], T]:
    """Class decorator: make a config dataclass selectable as ``algorithm.name: <name>``."""

    def wrap(cls: T) -> T:
        if name in _REGISTRY:
            raise ConfigError(f"algorithm config {name!r} is registered twice")
        _REGISTRY[name] = cls
        return cls

    return wrap


@dataclass
class AlgorithmConfig:
    """Fields every algorithm has. Subclasses add their own knobs with defaults."""

    name: str = "grpo"

    #: set by subclasses; whether the algorithm needs a critic engine.
    needs_critic: ClassVar[bool] = False

    @classmethod
    def variant_class(cls, name: str) -> type["AlgorithmConfig"]:
        """The registered config class for ``name``; a ConfigError names the closest valid name."""
        try:
            return _REGISTRY[name]
        except KeyError:
            known = sorted(_REGISTRY)
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"algorithm.name: unknown algorithm {name!r}.{hint} Choose one of: {', '.join(known)}."
            ) from None

    @classmethod
    def names(cls) -> list[str]:
        return sorted(_REGISTRY)


@register_algorithm_config("grpo")
@dataclass
class GRPOConfig(AlgorithmConfig):
    """Group Relative Policy Optimization (critic-free, group-normalised advantages)."""

    name: str = "grpo"
    eps_clip: float = 0.2
