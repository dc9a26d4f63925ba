"""Deep merge of config trees, guided by the schema, plus the record of where each key was set.

Mappings merge key by key; anything else (scalars, lists, ``null``) replaces what was there. One
schema-aware exception: when a tagged-union section (``algorithm``) changes its ``name``, the
section starts afresh from the new variant's defaults instead of keeping the old variant's keys.
"""

from __future__ import annotations

import copy
import logging
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from areal_tasks.config.schema_types import (
    DISCRIMINATOR,
    default_variant_name,
    field_types,
    is_dataclass_type,
    is_tagged_union,
    join_path,
    node_class,
    strip_optional,
)
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

#: ``{dotted path: where it was set}``, e.g. ``{"actor.optimizer.lr": "override 'actor.optimizer.lr=1e-5'"}``.
Origins = dict[str, str]


def child_type(tp: Any, data: Any, key: str) -> Any:
    """The schema type of ``data[key]`` when ``data`` has type ``tp``; None when not known."""
    inner, _ = strip_optional(tp)
    if is_dataclass_type(inner):
        try:
            cls = node_class(inner, data)
        except ConfigError:
            return None  # an unknown variant name: reported when the tree is built
        return field_types(cls).get(key)
    if typing.get_origin(inner) is dict:
        args = typing.get_args(inner)
        return args[1] if args else Any
    return None


def variant_changes(tp: Any, old: Any, new: Mapping[str, Any]) -> bool:
    """Whether merging ``new`` into ``old`` switches the variant of tagged union ``tp``."""
    inner, _ = strip_optional(tp)
    if not is_tagged_union(inner) or DISCRIMINATOR not in new:
        return False
    old_name = old.get(DISCRIMINATOR) if isinstance(old, Mapping) else None
    if old_name is None:
        old_name = default_variant_name(inner)
    return str(new[DISCRIMINATOR]) != str(old_name)


def deep_merge(base: Any, child: Any, tp: Any = None) -> Any:
    """``child`` merged over ``base`` (neither is modified); ``tp`` is the schema type of the node."""
    if not (isinstance(base, Mapping) and isinstance(child, Mapping)) or variant_changes(tp, base, child):
        return copy.deepcopy(child)
    merged = copy.deepcopy(dict(base))
    for key, value in child.items():
        if key in merged:
            merged[key] = deep_merge(merged[key], value, child_type(tp, merged, key))
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def node_paths(data: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted path in a tree: inner mappings and leaves alike."""
    if not isinstance(data, Mapping):
        return
    for key, value in data.items():
        path = join_path(prefix, str(key))
        yield path
        yield from node_paths(value, path)


def record_origins(origins: Origins, data: Any, source: str, prefix: str = "") -> None:
    """Note ``source`` as the origin of ``prefix`` (if given) and of every path in ``data`` under it."""
    if prefix:
        origins[prefix] = source
    for path in node_paths(data, prefix):
        origins[path] = source
