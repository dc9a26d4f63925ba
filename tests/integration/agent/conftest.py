"""Fixtures of the agent fidelity tests: one ``areal serve`` process on the tiny qwen2 model (fp32,
CPU) for the module, started by the embedded-server harness, and a transformers reference model."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_HARNESS = str(Path(__file__).parents[1] / "inference_server")
if SERVER_HARNESS not in sys.path:
    sys.path.insert(0, SERVER_HARNESS)

from embedded_server import ADMIN_KEY, running_server  # noqa: E402


@pytest.fixture(scope="module")
def agent_server(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("agent-server") / "server.log"
    with running_server(tiny_qwen2, log, "--admin-api-key", ADMIN_KEY, "--context-length", "2048") as url:
        yield url


@pytest.fixture(scope="module")
def admin_key() -> str:
    return ADMIN_KEY


@pytest.fixture(scope="module")
def reference_model(tiny_qwen2: Path):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
