"""Distributed-test setup: the launcher and worker modules of this folder are importable by name
(in the pytest process here, in the worker processes through the launcher's PYTHONPATH)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
