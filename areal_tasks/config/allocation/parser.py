"""Syntax: allocation spec text -> a positioned raw tree (no semantic checks).

Parsing is LALR over ``grammar.lark`` with lark's contextual lexer. The raw tree keeps the
character offset of every backend, name and dim so that :mod:`.validate` can point its caret
at the exact culprit. Lark's own exceptions never escape: they become
:class:`~areal_tasks.errors.AllocationError` through :mod:`.syntax_errors`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedInput

from areal_tasks.config.allocation.syntax_errors import syntax_error
from areal_tasks.errors import AllocationError


@dataclass(frozen=True)
class RawDim:
    """One ``<letter><size>`` item, e.g. ``d4`` at offset ``pos``."""

    letter: str
    size: int
    pos: int

    @property
    def text(self) -> str:
        return f"{self.letter}{self.size}"


@dataclass(frozen=True)
class RawPart:
    """One half of a hybrid layout: ``attn:...`` or ``ffn:...``."""

    label: str
    pos: int
    dims: tuple[RawDim, ...]


@dataclass(frozen=True)
class RawComponent:
    """A component as written: backend, optional name, and either plain dims or hybrid parts."""

    backend: str
    pos: int
    text: str
    name: str | None
    name_pos: int | None
    dims: tuple[RawDim, ...]
    parts: tuple[RawPart, ...] | None


#: the spec as pools (separated by ``+``) of colocated components (joined by ``|``).
RawSpec = tuple[tuple[RawComponent, ...], ...]

_ALLOWED_SPACE_NEIGHBOURS = "+|"
_SPACE_RUN = re.compile(r"\s+")


@functools.lru_cache(maxsize=1)
def _lark() -> Lark:
    grammar = resources.files(__package__).joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=True)


def parse_raw(spec: str) -> RawSpec:
    """Parse ``spec`` into pools of raw components; AllocationError on any syntax problem."""
    if not isinstance(spec, str):
        raise AllocationError(
            f"an allocation spec must be a string, got {type(spec).__name__}",
            hint="write e.g. 'sglang:d2+fsdp:d4'",
        )
    if not spec.strip():
        raise AllocationError(
            "empty allocation spec",
            hint="write e.g. 'sglang:d2+fsdp:d4' (inference on 2 GPUs, training on 4)",
        )
    _check_whitespace(spec)
    try:
        tree = _lark().parse(spec)
    except UnexpectedInput as exc:
        raise syntax_error(spec, exc) from None
    return _ToRaw(spec).transform(tree)


def _check_whitespace(spec: str) -> None:
    """Allow whitespace only at the ends and around ``+`` / ``|``; a space elsewhere is a typo."""
    for run in _SPACE_RUN.finditer(spec):
        start, end = run.span()
        if start == 0 or end == len(spec):
            continue
        if spec[start - 1] in _ALLOWED_SPACE_NEIGHBOURS or spec[end] in _ALLOWED_SPACE_NEIGHBOURS:
            continue
        if re.match(r"[a-z][a-z0-9_\-]*\s*[\[:]", spec[end:]):
            hint = "separate components with '+' (separate GPUs) or '|' (shared GPUs), e.g. 'sglang:d2+fsdp:d4'"
        else:
            hint = (
                "whitespace is allowed only around '+' and '|'; "
                "write a component without spaces, e.g. 'fsdp[actor]:d4t2'"
            )
        raise AllocationError(
            f"invalid allocation spec: unexpected whitespace at position {start}",
            spec=spec,
            position=start,
            hint=hint,
        )


class _ToRaw(Transformer):
    """Turns lark's tree into :class:`RawComponent` pools, keeping every token's offset."""

    def __init__(self, spec: str) -> None:
        super().__init__()
        self._spec = spec

    def start(self, pools: list[tuple[RawComponent, ...]]) -> RawSpec:
        return tuple(pools)

    def pool(self, components: list[RawComponent]) -> tuple[RawComponent, ...]:
        return tuple(components)

    def label(self, items: list[Token]) -> Token:
        return items[0]

    def dims(self, tokens: list[Token]) -> tuple[RawDim, ...]:
        return tuple(RawDim(tok[0], int(tok[1:]), tok.start_pos) for tok in tokens)

    def part(self, items: list) -> RawPart:
        label, dims = items
        return RawPart(str(label), label.start_pos, dims)

    def hybrid(self, parts: list[RawPart]) -> tuple[RawPart, ...]:
        return tuple(parts)

    @v_args(meta=True)
    def component(self, meta, items: list) -> RawComponent:
        backend, *rest = items
        name = rest[0] if len(rest) == 2 else None
        layout = rest[-1]
        hybrid = bool(layout) and isinstance(layout[0], RawPart)
        return RawComponent(
            backend=str(backend),
            pos=backend.start_pos,
            text=self._spec[meta.start_pos : meta.end_pos],
            name=None if name is None else str(name),
            name_pos=None if name is None else name.start_pos,
            dims=() if hybrid else layout,
            parts=layout if hybrid else None,
        )
