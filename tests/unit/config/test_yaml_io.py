"""YAML 1.2 core-schema scalars: what overrides and files parse to, and dumps that load back equal."""

from __future__ import annotations

import math

import pytest

from areal_tasks.config.yaml_io import dump_yaml, load_yaml, parse_scalar
from areal_tasks.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1e-6", 1e-6),
        ("1.0e-06", 1e-6),
        ("-3", -3),
        ("010", 10),
        ("0x1f", 31),
        ("true", True),
        ("False", False),
        ("on", "on"),
        ("no", "no"),
        ("null", None),
        ("", None),
        ("2024-01-01", "2024-01-01"),
        ("[a, 1]", ["a", 1]),
        ("{k: v}", {"k": "v"}),
    ],
)
def test_parse_scalar_uses_core_schema(text: str, expected: object) -> None:
    value = parse_scalar(text)
    assert value == expected
    assert type(value) is type(expected)


def test_special_floats() -> None:
    assert parse_scalar(".inf") == math.inf
    assert parse_scalar("-.inf") == -math.inf
    assert math.isnan(parse_scalar(".nan"))


def test_dump_quotes_strings_that_look_like_other_types() -> None:
    data = {"a": "1e-6", "b": "true", "c": "010", "d": 1e-6, "e": "null", "f": [1, "2"], "g": None}
    assert load_yaml(dump_yaml(data)) == data


def test_duplicate_key_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"f\.yaml: duplicate key 'a' at line 2"):
        load_yaml("a: 1\na: 2\n", source="f.yaml")


def test_syntax_error_names_source() -> None:
    with pytest.raises(ConfigError, match=r"x\.yaml: invalid YAML"):
        load_yaml("a: [1, 2\n", source="x.yaml")
