"""Fixtures of the embedded-server HTTP tests: one ``areal serve`` process (tiny qwen2, admin API
key set, pytest's temporary directories a weight root) for the whole session, an HTTP client for
it, and a transformers reference model.

``embedded_server.py`` beside this file starts and stops servers. ``AREAL_TEST_HTTP_FRONTEND``
(``inline`` or ``process``) and ``AREAL_TEST_SWITCH_INTERVAL_US`` run the session's server with
``--http-frontend`` and ``--switch-interval-us`` other than the defaults. Tests that change the served
weights put the original ones back before they end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

HERE = str(Path(__file__).parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from embedded_server import ADMIN_KEY, running_server  # noqa: E402


@pytest.fixture(scope="session")
def server_url(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("embedded-server") / "server.log"
    with running_server(
        tiny_qwen2,
        log,
        "--admin-api-key",
        ADMIN_KEY,
        "--context-length",
        "2048",
        "--max-running-requests",
        "8",
        "--tool-call-parser",
        "qwen25",
        "--weight-root",
        str(tmp_path_factory.getbasetemp()),  # tests write weight updates under their tmp_path
        "--http-frontend",
        os.environ.get("AREAL_TEST_HTTP_FRONTEND", "inline"),
        "--switch-interval-us",
        os.environ.get("AREAL_TEST_SWITCH_INTERVAL_US", "5000"),
    ) as url:
        yield url


@pytest.fixture(scope="session")
def http(server_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server_url, timeout=120.0) as client:
        yield client


@pytest.fixture(scope="session")
def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="session")
def reference(tiny_qwen2: Path):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).eval()
