"""The benchmark scripts import their sibling helpers (``from profiling import ...``) as scripts
do, with ``benchmarks/`` first on ``sys.path``; the tests that import the scripts put it there too."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = str(Path(__file__).resolve().parents[3] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)
