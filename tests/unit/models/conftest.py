"""Shared fixtures of the models tests: every tiny family built once per session (reused from the cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.models import TINY_FAMILIES, build_tiny_model


@pytest.fixture(scope="session")
def tiny_dirs() -> dict[str, Path]:
    """family -> directory of its tiny model (seed 0), from the persistent tiny cache."""
    return {family: build_tiny_model(family) for family in TINY_FAMILIES}
