"""Tokenising runs off the event loop: ``/health`` answers while the server tokenises a huge prompt.

Before, ``/generate`` and the OpenAI routes tokenised on the event loop: a 10 MB prompt kept
``/health`` (and every other request) waiting for seconds, and the fleet would restart a server
that was merely busy. This server lets a 3 MB prompt through its character bound (which would
otherwise refuse it before tokenising) so that tokenising it takes a while on the tokenize lane.
Probes sent meanwhile must be answered *while* the big request is still in flight: with the loop
held, a probe could only be answered after the big request's answer (at most the one probe that
races it). Counting answers, not timing them, keeps the test independent of the machine's load.
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

TEXT = "hello world " * 250_000  # 3 MB: seconds of tokenising, far more tokens than the context
#: probes answered during the big request, at least (with the loop held: one at most)
ANSWERED_DURING = 5


@pytest.fixture(scope="module")
def roomy_url(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("embedded-server-loop") / "server.log"
    flags = ("--context-length", "2048", "--max-prompt-chars", str(10 * len(TEXT)), "--tokenize-timeout", "600")
    with running_server(tiny_qwen2, log, *flags) as url:
        yield url


def test_health_answers_while_a_huge_prompt_is_tokenised(roomy_url: str) -> None:
    answer: dict[str, httpx.Response] = {}

    def send() -> None:
        answer["big"] = httpx.post(f"{roomy_url}/v1/completions", json={"prompt": TEXT, "max_tokens": 1}, timeout=900)

    sender = threading.Thread(target=send)
    sender.start()
    answered_during = 0
    with httpx.Client(base_url=roomy_url, timeout=900) as http:
        while sender.is_alive():
            assert http.get("/health").status_code == 200
            answered_during += sender.is_alive()
            time.sleep(0.05)
    sender.join()
    big = answer["big"]
    assert big.status_code == 400 and "context length" in big.json()["error"]["message"]
    assert answered_during >= ANSWERED_DURING, f"only {answered_during} probes answered while the prompt was tokenised"
