"""Shared pytest setup: GPU tests skip themselves without CUDA, the tests that need the live Airflow
and MLflow servers run last, the tiny-model cache is per test run directory unless AREAL_CACHE_DIR
is set, and a few session fixtures hand out tiny models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# s3_server / s3_bucket / s3_storage: a real SeaweedFS S3 server per session (tests/fixtures/s3_server.py).
# warm_start: the SFT'd demo policy the RL and cluster tests start from (tests/fixtures/warm_start.py).
# calculator_warm_start: the calculator task's SFT warm start (tests/fixtures/calculator_warm_start.py).
pytest_plugins = ["tests.fixtures.s3_server", "tests.fixtures.warm_start", "tests.fixtures.calculator_warm_start"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


#: the session fixture that starts ``airflow standalone`` and an MLflow server (tests/integration/airflow).
LIVE_SERVERS = "live_servers"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The live servers stay up from their first test to the end of the session, and their
    # scheduler, DAG processor and triggerer keep polling: on a 2-core machine that slowed every
    # later test, the RL warm start most. Their tests go last, in their own order.
    items.sort(key=lambda item: LIVE_SERVERS in getattr(item, "fixturenames", ()))
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _cuda_available():
        skip = pytest.mark.skip(reason="needs CUDA (run on a GPU machine)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_model_factory():
    """``factory(family, seed=0, **config_overrides) -> Path`` of a cached tiny HF model directory."""
    from areal_tasks.models import build_tiny_model

    def factory(family: str = "qwen2", seed: int = 0, **config_overrides) -> Path:
        return Path(build_tiny_model(family, seed=seed, **config_overrides))

    return factory


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_model_factory) -> Path:
    return tiny_model_factory("qwen2")


@pytest.fixture(scope="session")
def tiny_qwen2_vl(tiny_model_factory) -> Path:
    """The tiny Qwen2-VL (``areal_tasks.models.tiny.vision_kit``)."""
    return tiny_model_factory("qwen2_vl")


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl(tiny_model_factory) -> Path:
    """The tiny Qwen2.5-VL (``areal_tasks.models.tiny.vision_kit``)."""
    return tiny_model_factory("qwen2_5_vl")


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
