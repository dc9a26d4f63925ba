"""Fixtures for the dataset tests: ``datasets``' Arrow cache goes to the session's temporary directory,
and ``no_stream_sleep`` turns off the pause ``datasets`` takes when a shuffled parquet stream ends."""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def hf_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep ``datasets``' cache out of the home directory (one directory per test session)."""
    if importlib.util.find_spec("datasets") is None:
        return
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.getbasetemp() / "hf-datasets-cache")


@pytest.fixture
def no_stream_sleep(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``datasets`` sleeps 5 s when a shuffled parquet stream closes (an Arrow shutdown workaround): not here."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)
    yield
    gc.collect()  # close this test's half-read streams while the sleep is still off
