"""docs/allocation.md stays true: every example in its tables behaves as the table says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from areal_tasks.config.allocation import parse_allocation
from areal_tasks.errors import AllocationError

DOC = Path(__file__).resolve().parents[3] / "docs" / "allocation.md"
PREFIX = "invalid allocation spec: "


def _rows(section: str) -> list[list[str]]:
    """Cells of the table that follows the line ``section`` (markdown escapes undone)."""
    text = DOC.read_text(encoding="utf-8").split(f"\n{section}\n", 1)[1]
    rows = []
    for line in text.strip().splitlines():
        if not line.startswith("|"):
            break
        cells = [c.strip().replace("\\|", "|").replace("\\*", "*") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells[0].startswith("`"):
            rows.append(cells)
    return rows


def _lead(cell: str) -> str:
    """The literal start of a doc cell, up to any '...' elision."""
    return cell.split("...")[0].strip()


VALID_ROWS = _rows("Valid:")
INVALID_ROWS = _rows("Invalid (message, then hint; the caret position is in the message):")


def test_tables_were_found() -> None:
    assert len(VALID_ROWS) >= 10 and len(INVALID_ROWS) >= 15


@pytest.mark.parametrize("row", VALID_ROWS, ids=[r[0] for r in VALID_ROWS])
def test_documented_valid_example(row: list[str]) -> None:
    spec, gpus = row[0].strip("`"), int(row[1])
    assert parse_allocation(spec).total_gpus == gpus


@pytest.mark.parametrize("row", INVALID_ROWS, ids=[r[0] for r in INVALID_ROWS])
def test_documented_invalid_example(row: list[str]) -> None:
    spec_cell, message, hint = row
    spec = spec_cell.split("`")[1]
    gpus = int(spec_cell.split("--gpus ")[1].rstrip("`")) if "--gpus" in spec_cell else None
    with pytest.raises(AllocationError) as info:
        parse_allocation(spec, total_gpus=gpus)
    assert info.value.args[0].startswith(PREFIX + _lead(message))
    assert info.value.hint.startswith(_lead(hint))
