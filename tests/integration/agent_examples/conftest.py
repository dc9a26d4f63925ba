"""Fixtures of the agent example tests: ``areal serve`` on the calculator warm start (chat
completions with tool calls, ``--tool-call-parser qwen25``, an API key the agents must send) and a
recording forwarder in front of it that forces greedy sampling, so each test sees what its agent
put on the wire and gets the same answers every run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
for _helpers in (
    Path(__file__).parent,
    ROOT / "tests" / "integration" / "inference_server",
    ROOT / "examples" / "agents",
):
    if str(_helpers) not in sys.path:
        sys.path.insert(0, str(_helpers))

from embedded_server import running_server  # noqa: E402 - importable once its folder is on sys.path
from recorder import Recorder  # noqa: E402 - likewise

API_KEY = "agent-test-key"
ADMIN_KEY = "agent-test-admin-key"
_KEY_ENV, _ADMIN_ENV = "AREAL_AGENT_TEST_API_KEY", "AREAL_AGENT_TEST_ADMIN_KEY"


@pytest.fixture(scope="session")
def calculator_server(calculator_warm_start: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of ``areal serve`` on the calculator warm start (keys passed through the environment)."""
    os.environ[_KEY_ENV], os.environ[_ADMIN_ENV] = API_KEY, ADMIN_KEY
    log = tmp_path_factory.mktemp("calculator-server") / "server.log"
    try:
        with running_server(
            Path(calculator_warm_start),
            log,
            *("--api-key-env", _KEY_ENV, "--admin-api-key-env", _ADMIN_ENV, "--tool-call-parser", "qwen25"),
            *("--context-length", "1024", "--max-running-requests", "8"),
        ) as url:
            yield url
    finally:
        os.environ.pop(_KEY_ENV, None)
        os.environ.pop(_ADMIN_ENV, None)


@pytest.fixture(scope="session")
def api_key() -> str:
    """The key the server requires (what the agents get as ``OPENAI_API_KEY``)."""
    return API_KEY


@pytest.fixture
def recorder(calculator_server: str) -> Iterator[Recorder]:
    """A fresh recording forwarder to the server, sampling greedily."""
    with Recorder(calculator_server, overrides={"temperature": 0.0}) as rec:
        yield rec
