"""Type introspection for the config dataclasses: field types, optionals, tagged unions, names.

Shared by the builder (typed values from plain data), the override parser and the file merger, so
all three agree on what a key is and how a type is spelled in error messages.

A *tagged union* is any dataclass type with a ``variant_class(name)`` classmethod (for example
``AlgorithmConfig``): its mapping is built as the class ``variant_class(mapping["name"])`` returns,
``name`` defaulting to the base class's default.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import types
import typing
from typing import Any, Literal, Union

logger = logging.getLogger(__name__)

#: the key that selects the variant of a tagged union.
DISCRIMINATOR = "name"


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """``{field name: resolved type}`` of a dataclass, in declaration order (ClassVars excluded)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def is_union(tp: Any) -> bool:
    """Whether ``tp`` is ``X | Y`` or ``Optional[X]`` (either spelling)."""
    return typing.get_origin(tp) in (Union, types.UnionType)


def strip_optional(tp: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``; ``(tp, False)`` otherwise. Multi-member unions keep their other members."""
    if not is_union(tp):
        return tp, False
    members = [m for m in typing.get_args(tp) if m is not type(None)]
    optional = len(members) < len(typing.get_args(tp))
    if len(members) == 1:
        return members[0], optional
    return Union[tuple(members)], optional  # noqa: UP007 - built from a runtime tuple


def is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def is_tagged_union(tp: Any) -> bool:
    """A dataclass type whose concrete class is chosen by ``name`` through ``variant_class``."""
    return is_dataclass_type(tp) and callable(getattr(tp, "variant_class", None))


def default_variant_name(tp: type) -> str:
    """The ``name`` a tagged union gets when none is given: the base class's field default."""
    for f in dataclasses.fields(tp):
        if f.name == DISCRIMINATOR and f.default is not dataclasses.MISSING:
            return str(f.default)
    raise TypeError(f"tagged union {tp.__name__} needs a '{DISCRIMINATOR}' field with a default")


def variant_of(tp: type, data: Any) -> type:
    """The concrete class of tagged union ``tp`` for mapping ``data`` (``name`` key or the default)."""
    name = data.get(DISCRIMINATOR) if isinstance(data, dict) else None
    if name is None:
        name = default_variant_name(tp)
    return tp.variant_class(str(name))


def node_class(tp: type, data: Any) -> type:
    """The dataclass that a mapping for a field of type ``tp`` builds (resolves tagged unions)."""
    return variant_of(tp, data) if is_tagged_union(tp) else tp


def type_name(tp: Any) -> str:
    """How a type is spelled in an error message: ``int``, ``float | None``, ``one of 'a', 'b'``."""
    if tp is Any:
        return "any value"
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if is_union(tp):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return f"list[{type_name(item)}]"
    if origin is dict:
        key, value = typing.get_args(tp) or (Any, Any)
        return f"dict[{type_name(key)}, {type_name(value)}]"
    if is_dataclass_type(tp):
        return f"a mapping ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def closest(name: str, valid: typing.Iterable[str]) -> str | None:
    """The valid name closest to a misspelt one, if any is close enough."""
    matches = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return matches[0] if matches else None


def join_path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def unknown_key_message(prefix: str, key: str, valid: typing.Iterable[str]) -> str:
    """``actor.optimiser: unknown key; did you mean actor.optimizer? Valid keys at actor: ...``."""
    valid = list(valid)
    where = prefix or "the top level"
    text = f"{join_path(prefix, key)}: unknown key"
    suggestion = closest(key, valid)
    if suggestion is not None:
        text += f"; did you mean {join_path(prefix, suggestion)}?"
    else:
        text += "."
    return text + f" Valid keys at {where}: {', '.join(valid)}"
