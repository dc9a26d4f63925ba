"""The client stops what it abandons on the real embedded server.

A long greedy request under a short client timeout (or cancelled by its caller) leaves the server
with nothing running or queued soon after (the client's ``/abort_request``, without which the
server would decode to ``max_new_tokens``), and the next request is served normally.

This module runs its own server, its admin key handed over through the environment as a job's is
(``--admin-api-key-env``), and a client that sends it on ``/abort_request``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from embedded_server import running_server
from server_metrics import RUNNING, wait_idle, wait_metric

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.errors import InferenceRetriesExhaustedError
from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7, 8, 9]
#: far more decode steps than the few seconds this test waits (1 CPU thread)
LONG = SamplingParams(max_new_tokens=2000, temperature=0, ignore_eos=True)
#: the server must be idle this soon after the client gave up (a bound, not a measurement)
IDLE_WITHIN_S = 2.0


ADMIN_ENV, ADMIN_KEY = "AREAL_TEST_ABORT_ADMIN_KEY", "abort-test-admin-key"


@pytest.fixture(scope="module")
def server_url_with_env_key(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("embedded-server-abort") / "server.log"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ADMIN_ENV, ADMIN_KEY)  # the server inherits it, as from the LocalScheduler
        args = ("--admin-api-key-env", ADMIN_ENV, "--context-length", "2048", "--max-running-requests", "4")
        with running_server(tiny_qwen2, log, *args) as url:
            yield url


def _engine(url: str, **config: float) -> RemoteInferenceEngine:
    return RemoteInferenceEngine([url], make_adapter("embedded"), ClientConfig(admin_api_key=ADMIN_KEY, **config))


def test_a_timed_out_request_stops_on_the_server(server_url_with_env_key: str) -> None:
    async def scenario() -> None:
        async with _engine(server_url_with_env_key, request_timeout_s=0.5, max_retries=0) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest(PROMPT, LONG)))
            await asyncio.to_thread(wait_metric, server_url_with_env_key, RUNNING, 1, 30.0)
            with pytest.raises(InferenceRetriesExhaustedError, match="no answer within"):
                await task
            await asyncio.to_thread(
                wait_idle, server_url_with_env_key, IDLE_WITHIN_S, "an idle server after the timeout"
            )
        async with _engine(server_url_with_env_key, request_timeout_s=60.0) as engine:
            resp = await engine.agenerate(
                ModelRequest(PROMPT, SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True))
            )
        assert resp.stop_reason == "length" and resp.output_len == 4

    asyncio.run(scenario())


def test_a_cancelled_request_stops_on_the_server(server_url_with_env_key: str) -> None:
    async def scenario() -> None:
        async with _engine(server_url_with_env_key, request_timeout_s=60.0) as engine:
            task = asyncio.create_task(engine.agenerate(ModelRequest(PROMPT, LONG)))
            await asyncio.to_thread(wait_metric, server_url_with_env_key, RUNNING, 1, 30.0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.to_thread(
                wait_idle, server_url_with_env_key, IDLE_WITHIN_S, "an idle server after the cancellation"
            )
            resp = await engine.agenerate(
                ModelRequest(PROMPT, SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True))
            )
        assert resp.stop_reason == "length" and resp.output_len == 4

    asyncio.run(scenario())
