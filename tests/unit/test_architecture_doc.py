"""docs/architecture.md stays true to the tree: every module or folder its tables name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
#: where the page's paths live (a path may be written relative to any of these).
BASES = (
    "areal_tasks",
    "areal_tasks/engine",
    "areal_tasks/inference",
    "areal_tasks/rollout",
    "areal_tasks/trainer",
    ".",
)


def _named_paths() -> set[str]:
    """Backticked tokens in table rows that look like a module (``x.py``, ``a/b.py``) or a folder (``a/``)."""
    rows = "\n".join(line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("|"))
    tokens = set(re.findall(r"`([A-Za-z_][\w/]*(?:\.py|/))`", rows))
    return {t for t in tokens if not t.startswith(("http", "."))}


def _exists(token: str) -> bool:
    for base in BASES:
        for root in (ROOT / base, *sorted((ROOT / base).glob("*/"))):
            if (root / token.rstrip("/")).exists():
                return True
    return False


def test_every_module_the_architecture_page_names_exists() -> None:
    named = _named_paths()
    assert len(named) > 40, "the page should name the modules it describes"
    missing = sorted(t for t in named if not _exists(t))
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
