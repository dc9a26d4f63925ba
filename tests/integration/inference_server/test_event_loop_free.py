"""Tokenising runs off the event loop: ``/health`` answers while the server tokenises a huge prompt.

Before, ``/generate`` and the OpenAI routes tokenised on the event loop: a 10 MB prompt kept
``/health`` (and every other request) waiting for seconds, and the fleet would restart a server
that was merely busy. This server lets a 6 MB prompt through its character bound (which would
otherwise refuse it before tokenising) so that its tokenisation takes a while on the tokenize
lane; every ``/health`` probe meanwhile must be answered within its short timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from embedded_server import running_server

pytestmark = pytest.mark.integration

#: a probe's answer must come within this (a bound on the wait, not a measurement)
PROBE_TIMEOUT_S = 2.0
TEXT = "hello world " * 500_000  # 6 MB: seconds of tokenising, far more tokens than the context


@pytest.fixture(scope="module")
def roomy_url(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("embedded-server-loop") / "server.log"
    flags = ("--context-length", "2048", "--max-prompt-chars", str(10 * len(TEXT)), "--tokenize-timeout", "120")
    with running_server(tiny_qwen2, log, *flags) as url:
        yield url


def test_health_answers_while_a_huge_prompt_is_tokenised(roomy_url: str) -> None:
    answer: dict[str, httpx.Response] = {}

    def send() -> None:
        answer["big"] = httpx.post(f"{roomy_url}/v1/completions", json={"prompt": TEXT, "max_tokens": 1}, timeout=300)

    sender = threading.Thread(target=send)
    sender.start()
    probes_during = 0
    with httpx.Client(base_url=roomy_url, timeout=PROBE_TIMEOUT_S) as http:
        while sender.is_alive():
            assert http.get("/health").status_code == 200  # raises ReadTimeout if the loop is held
            probes_during += sender.is_alive()
            time.sleep(0.1)
    sender.join()
    big = answer["big"]
    assert big.status_code == 400 and "context length" in big.json()["error"]["message"]
    assert probes_during >= 3, "the prompt was tokenised too fast to tell; make TEXT longer"
