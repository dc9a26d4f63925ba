"""The client against the real embedded server started with an API key and an admin API key.

The server reads both keys from environment variables (``areal serve --api-key-env NAME
--admin-api-key-env NAME``, as the job launcher starts it); the client reads them from the variables
``rollout.server.api_key_env``/``admin_api_key_env`` name. With both keys, generate, pause/resume,
the abort of an abandoned attempt and a disk weight update work; without keys, or with the API key
alone on an admin call, the errors say which key to set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from embedded_server import running_server
from server_metrics import wait_idle

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.config.job import JobConfig
from areal_tasks.errors import InferenceControlError, InferenceRequestError, InferenceRetriesExhaustedError
from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter
from areal_tasks.inference.client.transport import ADMIN_PATHS

pytestmark = pytest.mark.integration

API_ENV, ADMIN_ENV = "AREAL_TEST_API_KEY", "AREAL_TEST_ADMIN_KEY"
KEYS = {API_ENV: "it-api-key", ADMIN_ENV: "it-admin-key"}
PROMPT = [5, 6, 7, 8, 9]
#: far more decode steps than the seconds this test waits (1 CPU thread)
LONG = SamplingParams(max_new_tokens=2000, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def keyed_url(tiny_qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("embedded-server-keys") / "server.log"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in KEYS.items():
            mp.setenv(name, value)  # the server inherits them, as from the LocalScheduler
        with running_server(
            tiny_qwen2,
            log,
            "--api-key-env",
            API_ENV,
            "--admin-api-key-env",
            ADMIN_ENV,
            "--context-length",
            "2048",
            "--max-running-requests",
            "4",
        ) as url:
            # the key values are not on the server's command line
            assert all(value not in " ".join(_cmdline_of(url)) for value in KEYS.values())
            yield url


def _cmdline_of(url: str) -> list[str]:
    """The command lines of the local processes listening on ``url``'s port (Linux /proc)."""
    port = url.rsplit(":", 1)[1]
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in cmdline and port.encode() in cmdline:
            out.append(b" ".join(cmdline).decode(errors="replace"))
    assert out, "the server process was not found"
    return out


def _engine(url: str, **config: object) -> RemoteInferenceEngine:
    return RemoteInferenceEngine([url], make_adapter("embedded"), ClientConfig(max_retries=0, **config))


def _engine_from_job(url: str) -> RemoteInferenceEngine:
    cfg = JobConfig()
    cfg.rollout.server.api_key_env, cfg.rollout.server.admin_api_key_env = API_ENV, ADMIN_ENV
    client = ClientConfig.from_rollout(cfg.rollout, environ=KEYS)
    return RemoteInferenceEngine([url], make_adapter(cfg.rollout.backend), client)


def test_the_client_admin_paths_cover_the_servers() -> None:
    from areal_tasks.inference.server.auth import ADMIN_PATHS as SERVER_ADMIN_PATHS

    assert SERVER_ADMIN_PATHS <= ADMIN_PATHS


def test_generate_pause_resume_and_disk_update_with_both_keys(keyed_url: str, tiny_qwen2: Path) -> None:
    async def scenario() -> None:
        async with _engine_from_job(keyed_url) as client:
            first = await client.agenerate(ModelRequest(PROMPT, SamplingParams(max_new_tokens=4, temperature=0)))
            assert len(first.output_ids) == 4
            await client.pause("abort")
            await client.update_weights(WeightUpdateMeta(type="disk", version=1, path=str(tiny_qwen2)))
            await client.resume()
            assert await client.server_versions() == {keyed_url: 1}
            again = await client.agenerate(ModelRequest(PROMPT, SamplingParams(max_new_tokens=4, temperature=0)))
            assert again.output_ids == first.output_ids and again.output_versions == [1] * 4

    asyncio.run(scenario())


def test_an_abandoned_attempt_is_aborted_with_the_admin_key(keyed_url: str, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with _engine(
            # far less than 2,000 tokens take, even on an idle machine (1 s was enough to finish them)
            keyed_url,
            api_key=KEYS[API_ENV],
            admin_api_key=KEYS[ADMIN_ENV],
            request_timeout_s=0.25,
        ) as client:
            with pytest.raises(InferenceRetriesExhaustedError):
                await client.agenerate(ModelRequest(PROMPT, LONG))
        await asyncio.to_thread(wait_idle, keyed_url, 5.0, "an idle server after the abandoned request")

    with caplog.at_level(logging.DEBUG, logger="areal_tasks.inference.client.core"):
        asyncio.run(scenario())
    assert "aborted on" in caplog.text and "abort on" not in caplog.text  # succeeded, no failure warning


def test_a_client_without_keys_gets_clear_errors(keyed_url: str) -> None:
    async def scenario() -> None:
        async with _engine(keyed_url) as client:
            with pytest.raises(InferenceRequestError) as gen:
                await client.agenerate(ModelRequest(PROMPT, SamplingParams(max_new_tokens=2)))
            assert "HTTP 401" in str(gen.value) and "no key was sent" in str(gen.value)
            assert "rollout.server.api_key_env" in str(gen.value)
            with pytest.raises(InferenceControlError) as pause:
                await client.pause("abort")
            assert "admin_api_key_env" in str(pause.value)
            assert await client.check_health() == {keyed_url: True}  # /health stays open

    asyncio.run(scenario())


def test_the_api_key_alone_cannot_pause_and_the_error_says_why(keyed_url: str) -> None:
    async def scenario() -> None:
        async with _engine(keyed_url, api_key=KEYS[API_ENV]) as client:
            out = await client.agenerate(ModelRequest(PROMPT, SamplingParams(max_new_tokens=2)))
            assert len(out.output_ids) == 2
            with pytest.raises(InferenceControlError) as exc:
                await client.pause("abort")
        text = str(exc.value)
        assert "admin endpoint" in text and "admin_api_key_env" in text
        assert all(value not in text for value in KEYS.values())

    asyncio.run(scenario())
