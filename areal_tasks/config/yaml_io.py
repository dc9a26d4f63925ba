"""YAML reading and writing with YAML 1.2 core-schema scalars.

PyYAML implements YAML 1.1, where ``1e-6`` is a *string*, ``on``/``no`` are booleans and ``010`` is
octal. Config files and ``key=value`` overrides are written by people who expect ``lr=1e-6`` to be a
float and ``trial=no`` to be a string, so both the loader and the dumper here use the YAML 1.2 core
schema: ``null``/``~``/empty, ``true``/``false``, decimal (and ``0x``/``0o``) integers, floats with an
optional exponent, ``.inf`` and ``.nan``. The dumper shares the resolvers, so any string that would
read back as another type is quoted and a dump always loads back to the same data.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import yaml

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"

#: (tag, regex, first characters) of the YAML 1.2 core schema.
_CORE_RESOLVERS: tuple[tuple[str, str, str], ...] = (
    (_NULL, r"^(?:~|null|Null|NULL|)$", "~nN"),
    (_BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    (_INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (_FLOAT, r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?)$", "-+.0123456789"),
    (_FLOAT, r"^(?:[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", "-+."),
)


def _install_core_resolvers(cls: type) -> None:
    """Replace the YAML 1.1 implicit resolvers of ``cls`` by the YAML 1.2 core schema ones."""
    cls.yaml_implicit_resolvers = {}
    for tag, pattern, first in _CORE_RESOLVERS:
        cls.add_implicit_resolver(tag, re.compile(pattern), list(first))
    # the empty plain scalar (``key:``) has no first character
    cls.add_implicit_resolver(_NULL, re.compile(r"^$"), [""])


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes every string the core-schema loader would read as another type."""


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0x"):
        return int(text[2:], 16)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return int(text, 10)


def _construct_float(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node))
    lowered = text.lower()
    if lowered.endswith(".inf"):
        return float("-inf") if lowered.startswith("-") else float("inf")
    if lowered == ".nan":
        return float("nan")
    return float(text)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """Build a mapping, rejecting duplicate keys (YAML forbids them; PyYAML silently keeps the last)."""
    loader.flatten_mapping(node)
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in result:
            mark = key_node.start_mark
            raise ConfigError(
                f"duplicate key {key!r} at line {mark.line + 1}, column {mark.column + 1}; "
                "each key may appear once per mapping"
            )
        result[key] = loader.construct_object(value_node, deep=True)
    return result


_install_core_resolvers(_Loader)
_install_core_resolvers(_Dumper)
_Loader.add_constructor(_INT, _construct_int)
_Loader.add_constructor(_FLOAT, _construct_float)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(text: str, source: str = "<string>") -> Any:
    """Parse one YAML document; a syntax error becomes a ConfigError naming ``source``."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def parse_scalar(text: str) -> Any:
    """Parse an override value as YAML (``1e-6`` -> float, ``[a, b]`` -> list, ``null`` -> None)."""
    return load_yaml(text, source=f"value {text!r}")


def dump_yaml(data: Any) -> str:
    """Block-style YAML that :func:`load_yaml` reads back to equal data; key order is kept."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)
