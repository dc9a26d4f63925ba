"""Fixtures of the embedded-server unit tests: one tiny qwen2 model runner and engine per module.

``server_helpers.py`` beside this file holds the request helpers. Torch runs on one thread here: the
tiny model's matmuls are far too small to gain from more, and the test machine's cores are shared.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig
from areal_tasks.inference.server.service import EmbeddedServer

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def runner(tiny_qwen2: Path, one_thread: None) -> ModelRunner:
    return ModelRunner(RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=8, context_length=512))


@pytest.fixture(scope="module")
def engine(runner: ModelRunner) -> Iterator[Engine]:
    eng = Engine(runner)
    eng.start()
    yield eng
    eng.shutdown()


@pytest.fixture
def server(engine: Engine) -> Iterator[EmbeddedServer]:
    """An embedded server over the module's engine, for tests that build its app in process."""
    made = EmbeddedServer(engine, engine.runner.cfg.model_path, "tiny")
    yield made
    made.lanes.shutdown()
    engine.limit_queue(None)
