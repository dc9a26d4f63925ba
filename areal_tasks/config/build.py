"""Build typed config dataclasses from plain data (merged YAML + overrides), checking every value.

Rules, per field type:

* ``int``: an integer (not a bool) within the signed 64-bit range. ``float``: a finite number
  (``.inf`` and ``.nan`` are refused); integers are accepted and converted.
* ``bool``: ``true``/``false`` only. ``str``: a string; a bare number (``trial: 1``) is accepted as its text.
* ``Literal[...]``: one of the choices. ``X | None``: ``null`` or an ``X``.
* ``list[X]`` / ``dict[str, X]``: checked item by item. ``Any``: anything.
* a dataclass: a mapping; missing keys take the field defaults; unknown keys are errors that name the
  closest valid key and every valid key at that level.
* a tagged union (see :mod:`areal_tasks.config.schema_types`): built as the variant ``name`` selects.

Every problem is collected and reported in one :class:`ConfigError`, each line naming the field
path, the bad value, what is allowed and where the value came from (file or override).
"""

from __future__ import annotations

import logging
import math
import re
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from areal_tasks.config.schema_types import (
    DISCRIMINATOR,
    field_types,
    is_dataclass_type,
    is_tagged_union,
    is_union,
    join_path,
    strip_optional,
    type_name,
    unknown_key_message,
    variant_of,
)
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: the largest integer a field takes: what the engines, torch and JSON readers hold without loss.
INT_MAX = 2**63 - 1


class _Invalid:
    """Marker for a value that failed to build (its problem is already recorded)."""


_INVALID = _Invalid()
_PARENT = re.compile(r"(?:\.[^.\[]+|\[\d+\])$")


def format_problems(problems: list[str], what: str = "invalid configuration") -> str:
    """One message for many problems: a header line, then one ``- problem`` line each."""
    if len(problems) == 1:
        return f"{what}: {problems[0]}"
    return f"{what} ({len(problems)} problems):\n" + "\n".join(f"  - {p}" for p in problems)


class _Builder:
    """Walks data and types together, recording problems instead of stopping at the first."""

    def __init__(self, origins: Mapping[str, str]) -> None:
        self.origins = origins
        self.problems: list[str] = []

    def _origin(self, path: str) -> str | None:
        """Where the value at ``path`` (or under it, or above it) was set, if known."""
        if path in self.origins:
            return self.origins[path]
        for key, source in self.origins.items():
            if key.startswith((path + ".", path + "[")):
                return source
        parent = _PARENT.sub("", path)
        while parent and parent != path:
            if parent in self.origins:
                return self.origins[parent]
            path, parent = parent, _PARENT.sub("", parent)
        return None

    def fail(self, path: str, message: str) -> _Invalid:
        source = self._origin(path)
        suffix = f" (set in {source})" if source else ""
        self.problems.append(f"{message}{suffix}")
        return _INVALID

    def _mismatch(self, tp: Any, value: Any, path: str) -> _Invalid:
        shown = "null" if value is None else f"{value!r} ({type(value).__name__})"
        return self.fail(path, f"{path}: expected {type_name(tp)}, got {shown}")

    def value(self, tp: Any, value: Any, path: str) -> Any:
        """``value`` converted to ``tp``, or ``_INVALID`` after recording why not."""
        if tp is Any:
            return value
        inner, optional = strip_optional(tp)
        if value is None:
            return None if optional or inner is type(None) else self._mismatch(tp, value, path)
        if is_union(inner):
            return self._union(tp, inner, value, path)
        origin = typing.get_origin(inner)
        if origin is Literal:
            choices = typing.get_args(inner)
            if any(value == c and type(value) is type(c) for c in choices):
                return value
            return self._mismatch(tp, value, path)
        if origin is list:
            return self._list(tp, inner, value, path)
        if origin is dict:
            return self._dict(tp, inner, value, path)
        if is_dataclass_type(inner):
            if not isinstance(value, Mapping):
                return self._mismatch(tp, value, path)
            return self.dataclass(inner, value, path)
        return self._scalar(tp, inner, value, path)

    def _scalar(self, tp: Any, inner: Any, value: Any, path: str) -> Any:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if inner is bool and isinstance(value, bool):
            return value
        if inner is int and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > INT_MAX:
                return self.fail(path, f"{path}: {value} is outside the 64-bit integer range (|value| <= 2**63 - 1)")
            return value
        if inner is float and is_number:
            try:
                number = float(value)
            except OverflowError:
                number = math.inf
            if not math.isfinite(number):
                return self.fail(path, f"{path}: expected a finite number, got {value!r}")
            return number
        if inner is str and (isinstance(value, str) or is_number):
            return value if isinstance(value, str) else str(value)
        if inner not in (bool, int, float, str) and isinstance(inner, type) and isinstance(value, inner):
            return value
        return self._mismatch(tp, value, path)

    def _union(self, tp: Any, inner: Any, value: Any, path: str) -> Any:
        for member in typing.get_args(inner):
            trial = _Builder(self.origins)
            result = trial.value(member, value, path)
            if result is not _INVALID:
                return result
        return self._mismatch(tp, value, path)

    def _list(self, tp: Any, inner: Any, value: Any, path: str) -> Any:
        if not isinstance(value, (list, tuple)):
            return self._mismatch(tp, value, path)
        (item_tp,) = typing.get_args(inner) or (Any,)
        items = [self.value(item_tp, item, f"{path}[{i}]") for i, item in enumerate(value)]
        return _INVALID if any(i is _INVALID for i in items) else items

    def _dict(self, tp: Any, inner: Any, value: Any, path: str) -> Any:
        if not isinstance(value, Mapping):
            return self._mismatch(tp, value, path)
        key_tp, value_tp = typing.get_args(inner) or (Any, Any)
        result: dict[Any, Any] = {}
        for key, item in value.items():
            built_key = self.value(key_tp, key, f"{path} key {key!r}")
            built = self.value(value_tp, item, join_path(path, str(key)))
            if built_key is _INVALID or built is _INVALID:
                return _INVALID
            result[built_key] = built
        return result

    def dataclass(self, cls: type, data: Mapping[str, Any], path: str) -> Any:
        """An instance of ``cls`` (a tagged union resolves to its variant) from mapping ``data``."""
        if is_tagged_union(cls):
            try:
                cls = variant_of(cls, data)
            except ConfigError as exc:
                where = join_path(path, DISCRIMINATOR)
                text = str(exc)
                return self.fail(where, text if text.startswith(where) else f"{where}: {text}")
        types_ = field_types(cls)
        before = len(self.problems)
        kwargs: dict[str, Any] = {}
        for key, raw in data.items():
            if key not in types_:
                self.fail(join_path(path, str(key)), unknown_key_message(path, str(key), types_))
                continue
            kwargs[key] = self.value(types_[key], raw, join_path(path, key))
        if len(self.problems) > before:
            return _INVALID
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            text = str(exc)
            named = path and (text.startswith((f"{path}.", f"{path}:")))
            return self.fail(path, text if named else f"{path or cls.__name__}: {text}")


def build_dataclass(cls: type[T], data: Mapping[str, Any], origins: Mapping[str, str] | None = None) -> T:
    """Build ``cls`` from ``data``; a ConfigError lists every problem found (not only the first)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"the configuration must be a mapping of sections, got {type(data).__name__}")
    builder = _Builder(origins or {})
    result = builder.dataclass(cls, data, "")
    if builder.problems:
        raise ConfigError(format_problems(builder.problems))
    return typing.cast(T, result)


def dataclass_problems(cls: type, data: Any, *, path: str, origins: Mapping[str, str] | None = None) -> list[str]:
    """What :func:`build_dataclass` would report for ``data``, built as ``cls`` at ``path`` of a
    configuration (a section checked by its own plug-in: ``rollout.workflow.options``); empty when it builds."""
    builder = _Builder(origins or {})
    if not isinstance(data, Mapping):
        return [f"{path}: expected a mapping, got {data!r} ({type(data).__name__})"]
    builder.dataclass(cls, data, path)
    return builder.problems
