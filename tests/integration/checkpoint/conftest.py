"""Checkpoint integration tests: the 2-rank launcher and workers of ``tests/distributed`` are importable
by name (as there), and the S3 fixtures come from ``tests/fixtures/s3_server.py``."""

from __future__ import annotations

import sys
from pathlib import Path

DISTRIBUTED = str(Path(__file__).resolve().parents[2] / "distributed")
if DISTRIBUTED not in sys.path:
    sys.path.insert(0, DISTRIBUTED)
