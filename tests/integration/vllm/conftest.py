"""Fixtures of the vLLM tests: the session's shared vLLM CPU server, and a per-test handle on it that
starts and ends with the base model's weights loaded.

The tests skip (with the reason) only when ``.venv-vllm`` is not built; ``make test`` builds it
through ``make vllm-env``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# this folder (vllm_test_server, shared with the protocol suite) and the protocol suite's folder
# (its helpers: partial_output, collective_sender)
for _helpers in (Path(__file__).parent, Path(__file__).resolve().parents[1] / "inference"):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))

import vllm_test_server  # noqa: E402 - importable only once its folder is on sys.path (above)
from vllm_session import VLLMSession  # noqa: E402 - likewise

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = vllm_test_server.vllm_missing_reason()
    if reason is None:
        return
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vllm_test_server.VLLMServer]:
    """The running vLLM server, shared with the protocol suite's vLLM backend."""
    with vllm_test_server.shared_vllm_server(tmp_path_factory.mktemp("vllm")) as server:
        yield server


@pytest.fixture
def vllm(vllm_server: vllm_test_server.VLLMServer, tmp_path: Path) -> Iterator[VLLMSession]:
    """The server holding the base model (seed 0), whatever earlier tests loaded; restored afterwards."""
    session = VLLMSession(vllm_server, vllm_server.reported_version() or 0, tmp_path)
    asyncio.run(session.load(vllm_server.model_path))
    yield session
    asyncio.run(session.load(vllm_server.model_path))
