"""Dotted command-line overrides: ``actor.optimizer.lr=1e-6``, ``ref=null``, ``rollout.sampling.stop=[a, b]``.

The value is parsed as YAML (:func:`areal_tasks.config.yaml_io.parse_scalar`) and merged into the
config tree as if one more child file had set it; types are checked when the tree is built. Keys are
checked against the schema here, so a misspelt key fails with the closest valid name. Setting a key
under a section that is ``null`` (``ref.optimizer.lr=1e-6`` while ``ref`` is unset) creates the
section from its defaults. Overrides apply in order, except that a tagged union's ``name``
(``algorithm.name=ppo``) is applied before the other overrides, so the knobs of the chosen algorithm
can be given in any order.
"""

from __future__ import annotations

import logging
import re
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from areal_tasks.config.build import format_problems
from areal_tasks.config.merge import Origins, child_type, deep_merge, record_origins, variant_changes
from areal_tasks.config.schema_types import (
    DISCRIMINATOR,
    field_types,
    is_dataclass_type,
    is_tagged_union,
    node_class,
    strip_optional,
    type_name,
    unknown_key_message,
)
from areal_tasks.config.yaml_io import parse_scalar
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z_][A-Za-z0-9_\-]*)*$")


@dataclass(frozen=True)
class Override:
    """One parsed ``key.path=value``."""

    text: str
    keys: tuple[str, ...]
    value: Any
    #: the value exactly as written (after stripping spaces).
    raw: str

    def value_for(self, tp: Any) -> Any:
        """The value for a field of type ``tp``: a ``str`` field takes the text as written.

        ``experiment.trial=007`` stays ``"007"`` and ``model.path=tiny:`` stays a string, though
        YAML reads them as 7 and a mapping; ``null`` and quoted text still parse as YAML.
        """
        inner, _ = strip_optional(tp)
        quoted = self.raw[:1] in ("'", '"')
        if inner is str and self.value is not None and not isinstance(self.value, str) and not quoted:
            return self.raw
        return self.value

    @property
    def path(self) -> str:
        return ".".join(self.keys)


def parse_override(text: str) -> Override:
    """Split ``a.b.c=value`` and parse the value as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key):
        raise ConfigError(f"override {text!r}: expected KEY=VALUE with a dotted key, e.g. actor.optimizer.lr=1e-6")
    try:
        value = parse_scalar(raw.strip())
    except ConfigError as exc:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {exc}") from exc
    return Override(text=text, keys=tuple(key.split(".")), value=value, raw=raw.strip())


def _check_key(tp: Any, data: Any, prefix: str, key: str) -> Any:
    """The schema type of ``key`` under the node ``prefix`` (type ``tp``, value ``data``), or a ConfigError."""
    inner, _ = strip_optional(tp)
    if is_dataclass_type(inner):
        cls = node_class(inner, data)
        types_ = field_types(cls)
        if key not in types_:
            raise ConfigError(unknown_key_message(prefix, key, types_))
        return types_[key]
    if typing.get_origin(inner) is dict or inner is Any:
        return child_type(inner, data, key) or Any
    raise ConfigError(f"{prefix} is {type_name(tp)}, it has no keys")


def is_discriminator(override: Override, schema: type) -> bool:
    """Whether ``override`` sets the ``name`` that selects a tagged-union section's variant."""
    if override.keys[-1] != DISCRIMINATOR:
        return False
    tp: Any = schema
    for key in override.keys[:-1]:
        inner, _ = strip_optional(tp)
        if not is_dataclass_type(inner) or is_tagged_union(inner):
            return False
        tp = field_types(inner).get(key)
        if tp is None:
            return False
    inner, _ = strip_optional(tp)
    return is_tagged_union(inner)


def apply_override(tree: dict[str, Any], override: Override, schema: type, origins: Origins) -> None:
    """Set ``override`` in ``tree`` (in place), creating null or missing sections on the way."""
    node: dict[str, Any] = tree
    tp: Any = schema
    prefix = ""
    for key in override.keys[:-1]:
        tp = _check_key(tp, node, prefix, key)
        prefix = f"{prefix}.{key}" if prefix else key
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{prefix} holds {child!r}, so {override.path} cannot be set; set {prefix} instead")
        node = child
    last = override.keys[-1]
    node_tp = tp
    tp = _check_key(node_tp, node, prefix, last)
    value = override.value_for(tp)
    if last == DISCRIMINATOR and variant_changes(node_tp, node, {last: value}):
        node.clear()  # switching variant: the section starts afresh from the new variant's defaults
    if isinstance(value, Mapping):
        node[last] = deep_merge(node.get(last), value, tp)
    else:
        node[last] = value
    record_origins(origins, value, f"override {override.text!r}", override.path)


def apply_overrides(tree: dict[str, Any], overrides: Sequence[str], schema: type, origins: Origins) -> None:
    """Parse and apply every override; variant selections (``algorithm.name=...``) go first."""
    parsed = [parse_override(text) for text in overrides]
    ordered = [o for o in parsed if is_discriminator(o, schema)] + [
        o for o in parsed if not is_discriminator(o, schema)
    ]
    problems: list[str] = []
    for override in ordered:
        try:
            apply_override(tree, override, schema, origins)
        except ConfigError as exc:
            problems.append(f"override {override.text!r}: {exc}")
            continue
        logger.debug("applied override %s", override.text)
    if problems:
        raise ConfigError(format_problems(problems, what="invalid command-line overrides"))
