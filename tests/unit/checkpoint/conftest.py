"""Fixtures of the checkpoint unit tests: the toy engine class and managers over file:// and memory://."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from areal_tasks.checkpoint.manager import CheckpointManager
from areal_tasks.config.sections import SaverConfig
from tests.unit.checkpoint.toy_engine import ToyEngine


def _make_manager(url: str, incremental: bool = True, **saver: Any) -> CheckpointManager:
    return CheckpointManager(url, None, "exp", "trial", SaverConfig(**saver), incremental=incremental)


@pytest.fixture
def toy_engine() -> type[ToyEngine]:
    """The ToyEngine class: ``toy_engine(seed=0)``."""
    return ToyEngine


@pytest.fixture
def make_manager() -> Any:
    """``make_manager(url, incremental=True, **saver_config_fields) -> CheckpointManager``."""
    return _make_manager


@pytest.fixture(params=["file", "memory"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path}/store"
    return f"memory://ckpt-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    return f"file://{tmp_path}/store"
