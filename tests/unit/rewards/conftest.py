"""Make ``reward_helpers`` importable as a top-level module, here and in reward worker processes.

The folder goes onto ``sys.path`` at collection; workers receive the caller's ``sys.path`` when they
start, so they import the helpers by the same name (the tests check that they do).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
