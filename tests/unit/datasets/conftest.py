"""Fixtures for the dataset tests: ``datasets``' Arrow cache goes to the session's temporary directory."""

from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(autouse=True)
def hf_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep ``datasets``' cache out of the home directory (one directory per test session), no sleeps."""
    if importlib.util.find_spec("datasets") is None:
        return
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.getbasetemp() / "hf-datasets-cache")
    # datasets sleeps this long after every shuffled parquet pass (an Arrow shutdown workaround): not in tests
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)
