"""The parsed, validated allocation: frozen dataclasses with JSON-ready ``to_dict()``.

An :class:`AllocationMode` is a tuple of :class:`Component` objects, each a backend with its
parallel dims. Instances are built by :func:`areal_tasks.config.allocation.parse_allocation`,
which has already checked every rule in ``docs/allocation.md``; the classes here only hold the
result and answer questions about it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from areal_tasks.errors import AllocationError

#: the five parallel dims, in canonical order.
DIM_LETTERS: tuple[str, ...] = ("d", "t", "p", "c", "e")

ComponentKind = Literal["inference", "training"]


@dataclass(frozen=True)
class ParallelDims:
    """Parallel degrees of one component: data, tensor, pipeline, context (Ulysses SP), expert.

    ``e`` does not add GPUs: experts are sharded over ranks that already exist (see the docs).
    """

    d: int = 1
    t: int = 1
    p: int = 1
    c: int = 1
    e: int = 1

    def __post_init__(self) -> None:
        for letter in DIM_LETTERS:
            value = getattr(self, letter)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AllocationError(
                    f"parallel dim {letter}={value!r} must be a positive integer",
                    hint="omitted dims are 1; write e.g. d4t2",
                )

    @property
    def world_size(self) -> int:
        """GPUs this layout occupies: d * t * p * c."""
        return self.d * self.t * self.p * self.c

    def to_dict(self) -> dict[str, int]:
        return {letter: getattr(self, letter) for letter in DIM_LETTERS}

    def to_spec(self) -> str:
        """Canonical dims text: the dims that differ from 1, in d/t/p/c/e order ("d1" if none)."""
        text = "".join(f"{k}{v}" for k, v in self.to_dict().items() if v != 1)
        return text or "d1"


@dataclass(frozen=True)
class HybridDims:
    """MoE hybrid layout: attention layers use ``attn`` (no e), expert FFN layers use ``ffn`` (no c)."""

    attn: ParallelDims
    ffn: ParallelDims

    @property
    def ffn_world_size(self) -> int:
        """GPUs the FFN layout spans: d * t * p * e (experts are a real axis here; c is 1)."""
        return self.ffn.d * self.ffn.t * self.ffn.p * self.ffn.e

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {"attn": self.attn.to_dict(), "ffn": self.ffn.to_dict()}


@dataclass(frozen=True)
class Component:
    """One inference or training backend with its layout.

    ``dims`` are the attention dims for a hybrid component. ``colocated_with`` names the other
    components sharing this component's GPUs (joined by ``|``).
    """

    backend: str
    kind: ComponentKind
    name: str | None
    dims: ParallelDims
    world_size: int
    colocated_with: tuple[str, ...] = ()
    hybrid: HybridDims | None = None

    @property
    def label(self) -> str:
        """The name if there is one, else the backend: how messages refer to this component."""
        return self.name or self.backend

    def to_spec(self) -> str:
        """Canonical spec text of this component alone, e.g. ``fsdp[actor]:d4t2``."""
        head = self.backend + (f"[{self.name}]" if self.name else "")
        if self.hybrid is not None:
            return f"{head}:(attn:{self.hybrid.attn.to_spec()}|ffn:{self.hybrid.ffn.to_spec()})"
        return f"{head}:{self.dims.to_spec()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "kind": self.kind,
            "name": self.name,
            "world_size": self.world_size,
            "dims": self.dims.to_dict(),
            "colocated_with": list(self.colocated_with),
            "hybrid": None if self.hybrid is None else self.hybrid.to_dict(),
        }


@dataclass(frozen=True)
class AllocationMode:
    """A validated allocation: its source ``spec``, its components and the GPUs it needs."""

    spec: str
    components: tuple[Component, ...]
    total_gpus: int
    _by_name: dict[str, Component] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {c.name: c for c in self.components if c.name is not None}
        object.__setattr__(self, "_by_name", by_name)

    def inference(self) -> list[Component]:
        """Inference components, in spec order."""
        return [c for c in self.components if c.kind == "inference"]

    def training(self) -> list[Component]:
        """Training components, in spec order."""
        return [c for c in self.components if c.kind == "training"]

    def get(self, name: str) -> Component:
        """The component called ``name``; AllocationError naming the known names otherwise."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none (no component is named)"
            raise AllocationError(
                f"no component named {name!r} in allocation {self.spec!r}",
                hint=f"named components: {known}; name one with brackets, e.g. fsdp[{name}]:d4",
            ) from None

    def actor_shares_inference_gpus(self) -> bool:
        """True when the actor is colocated (``|``) with an inference component."""
        actor = self.actor()
        return any(c.name is not None and c.name in actor.colocated_with for c in self.inference())

    def actor(self) -> Component:
        """The policy's training component.

        The training component named ``actor``; else the first unnamed training component; else
        the first training component. AllocationError if there is no training component.
        """
        training = self.training()
        if not training:
            raise AllocationError(
                f"allocation {self.spec!r} has no training component",
                hint="add one with '+', e.g. sglang:d2+fsdp:d4",
            )
        named = [c for c in training if c.name == "actor"]
        unnamed = [c for c in training if c.name is None]
        return (named or unnamed or training)[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "total_gpus": self.total_gpus,
            "components": [c.to_dict() for c in self.components],
        }
