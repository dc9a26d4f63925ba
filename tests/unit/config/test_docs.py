"""docs/configuration.md stays true to the code: every section table lists exactly the fields, types and defaults."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import areal_tasks.config as config_pkg
from areal_tasks.config.algorithm import AlgorithmConfig
from areal_tasks.config.schema_types import field_types, type_name

HEADING = re.compile(r"^### .*\(`(\w+)`\)\s*$")
ROW = re.compile(r"^\| `(\w+)` \| (.*?) \| (.*?) \| (.+) \|$")


def documented_tables(text: str) -> dict[str, list[tuple[str, str, str]]]:
    tables: dict[str, list[tuple[str, str, str]]] = {}
    current: str | None = None
    for line in text.splitlines():
        heading = HEADING.match(line)
        if heading:
            current = heading.group(1)
            tables[current] = []
        elif line.startswith("#"):
            current = None
        elif current is not None and (row := ROW.match(line)):
            tables[current].append((row.group(1), row.group(2), row.group(3)))
    return tables


def expected_default(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING:
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        value = f.default
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`" if isinstance(value, str) else f"`{value!r}`"


def test_every_section_table_matches_its_dataclass(repo_root: Path) -> None:
    tables = documented_tables((repo_root / "docs" / "configuration.md").read_text(encoding="utf-8"))
    documented = {name for name in tables if name != "AlgorithmConfig"}
    sections = {name for name in config_pkg.__all__ if name.endswith(("Config", "Spec")) and name != "AlgorithmConfig"}
    assert documented == sections
    for name in sorted(documented):
        cls = getattr(config_pkg, name)
        types = field_types(cls)
        expected = [
            (f.name, type_name(types[f.name]).replace(" | ", " or "), expected_default(f))
            for f in dataclasses.fields(cls)
        ]
        assert tables[name] == expected, f"docs/configuration.md table for {name} is out of date"


def test_algorithm_names_in_docs_are_registered(repo_root: Path) -> None:
    text = (repo_root / "docs" / "configuration.md").read_text(encoding="utf-8")
    paragraph = text.split("### algorithm (`AlgorithmConfig`)", 1)[1]
    named = re.findall(r"`(\w+)`", paragraph.split("; the remaining keys", 1)[0])
    assert set(named) - {"name"} <= set(AlgorithmConfig.names())
    assert "## Allocation mode" in text
