"""API keys end to end without a server: which key each call carries, what a refusal says, that no
key leaks into a repr, a message, a command line or a launch log, and how keys reach the servers."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fake_sglang import FakeCluster

from areal_tasks.api.inference import ModelRequest, SamplingParams
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.cli.serve_cmd import resolve_key
from areal_tasks.config.job import JobConfig
from areal_tasks.errors import ConfigError, InferenceControlError, InferenceRequestError
from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter
from areal_tasks.inference.client.protocol import GenerateInput
from areal_tasks.inference.client.transport import ADMIN_PATHS, choose_key, refusal_message
from areal_tasks.inference.launch import build_server_command
from areal_tasks.inference.launch.with_keys import apply_keys
from areal_tasks.launch.process import WorkerProcess
from storage.redact import redact_argv

API, ADMIN = "api-secret-123", "admin-secret-456"


# -- which key a call carries ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "api", "admin", "expected"),
    [
        ("/generate", API, ADMIN, ("api", API)),
        ("/generate", None, ADMIN, (None, None)),
        ("/pause_generation", API, ADMIN, ("admin", ADMIN)),
        ("/pause_generation", API, None, ("api", API)),
        ("/update_weights_from_disk", None, ADMIN, ("admin", ADMIN)),
        ("/health", None, None, (None, None)),
    ],
)
def test_choose_key(path: str, api: str | None, admin: str | None, expected: tuple) -> None:
    assert choose_key(path, api, admin) == expected


@pytest.mark.parametrize("backend", ["sglang", "embedded", "vllm"])
def test_adapter_admin_calls_are_admin_paths_and_data_calls_are_not(backend: str) -> None:
    adapter = make_adapter(backend)
    disk = WeightUpdateMeta(type="disk", version=1, path="/w")
    collective = WeightUpdateMeta(
        type="collective", version=1, group_name="g", master_addr="h", master_port=1, world_size=2
    )
    admin = [
        adapter.pause("abort"),
        adapter.resume(),
        adapter.update_weights_from_disk(disk),
        adapter.init_weight_group(collective, 1),
        adapter.update_weights_from_distributed(collective, []),
        adapter.abort("r-0000"),
        adapter.destroy_weight_group("g"),
        adapter.begin_weight_update(collective),
        adapter.end_weight_update(collective),
    ]
    for call in admin:
        if call is not None:
            assert call.path in ADMIN_PATHS, f"{backend}: {call.path} should carry the admin key"
    data = [adapter.generate(GenerateInput("r-0000", [1], SamplingParams())), adapter.health(), adapter.model_info()]
    for call in data:
        assert call.path not in ADMIN_PATHS, f"{backend}: {call.path} is not an admin call"


def test_refusal_messages_name_the_key_to_fix() -> None:
    assert "no key was sent" in refusal_message("/generate", None)
    assert "rollout.server.api_key_env" in refusal_message("/generate", None)
    assert "admin_api_key_env" in refusal_message("/pause_generation", None)
    assert "refused the admin API key" in refusal_message("/pause_generation", "admin")
    assert "needs its admin key" in refusal_message("/pause_generation", "api")
    assert "refused the API key" in refusal_message("/generate", "api")


# -- the engine against a fake SGLang server that checks keys like SGLang ----------------------


def _sglang_allows(path: str, header: str | None, api: str | None, admin: str | None) -> bool:
    if path.startswith("/health"):
        return True
    if path in ADMIN_PATHS and admin:
        return header == f"Bearer {admin}"
    return header == f"Bearer {api}" if api else True


def guarded(cluster: FakeCluster, api: str | None, admin: str | None, seen: list[tuple[str, str | None]]):
    inner = cluster.transport()

    async def handler(request: httpx.Request) -> httpx.Response:
        header = request.headers.get("Authorization")
        seen.append((request.url.path, header))
        if not _sglang_allows(request.url.path, header, api, admin):
            return httpx.Response(401, json={"error": "Unauthorized"})
        return await inner.handle_async_request(request)

    return lambda: httpx.MockTransport(handler)


def engine(cluster: FakeCluster, factory, **keys: str | None) -> RemoteInferenceEngine:
    cfg = ClientConfig(max_retries=0, **keys)
    return RemoteInferenceEngine(cluster.addresses, make_adapter("sglang"), cfg, transport_factory=factory)


def test_engine_sends_the_api_key_on_generate_and_the_admin_key_on_admin_calls(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[str, str | None]]:
        cluster, seen = FakeCluster(1), []
        async with engine(cluster, guarded(cluster, API, ADMIN, seen), api_key=API, admin_api_key=ADMIN) as client:
            resp = await client.agenerate(ModelRequest([1, 2], SamplingParams(max_new_tokens=3)))
            assert len(resp.output_ids) == 3
            await client.pause("abort")
            await client.update_weights(WeightUpdateMeta(type="disk", version=1, path=str(tmp_path)))
            await client.resume()
            assert await client.check_health() == {cluster.addresses[0]: True}
        return seen

    seen = asyncio.run(scenario())
    by_path = dict(seen)
    assert by_path["/generate"] == f"Bearer {API}"
    for path in ("/pause_generation", "/update_weights_from_disk", "/continue_generation"):
        assert by_path[path] == f"Bearer {ADMIN}"


def test_engine_without_keys_sends_no_header_and_fails_clearly() -> None:
    async def scenario() -> None:
        cluster, seen = FakeCluster(1), []
        async with engine(cluster, guarded(cluster, API, ADMIN, seen)) as client:
            with pytest.raises(InferenceRequestError) as gen:
                await client.agenerate(ModelRequest([1, 2], SamplingParams(max_new_tokens=3)))
            assert "HTTP 401" in str(gen.value) and "rollout.server.api_key_env" in str(gen.value)
            with pytest.raises(InferenceControlError) as pause:
                await client.pause("abort")
            assert "pause_generation" in str(pause.value) and "admin_api_key_env" in str(pause.value)
        assert all(header is None for _, header in seen)

    asyncio.run(scenario())


def test_engine_with_a_wrong_admin_key_says_so_without_showing_keys() -> None:
    async def scenario() -> None:
        cluster, seen = FakeCluster(1), []
        async with engine(
            cluster, guarded(cluster, API, ADMIN, seen), api_key=API, admin_api_key="wrong-key"
        ) as client:
            await client.agenerate(ModelRequest([1], SamplingParams(max_new_tokens=1)))
            with pytest.raises(InferenceControlError) as exc:
                await client.pause("abort")
        text = str(exc.value)
        assert "refused the admin API key" in text
        assert API not in text and "wrong-key" not in text

    asyncio.run(scenario())


# -- ClientConfig keeps keys secret --------------------------------------------------------------


def test_client_config_repr_hides_keys() -> None:
    cfg = ClientConfig(api_key=API, admin_api_key=ADMIN)
    assert API not in repr(cfg) and ADMIN not in repr(cfg)


@pytest.mark.parametrize("bad", ["", "two words", "trailing-newline\n", "caf\u00e9"])
def test_client_config_refuses_unsendable_keys_without_showing_them(bad: str) -> None:
    with pytest.raises(ConfigError) as exc:
        ClientConfig(api_key=bad)
    assert "api_key must be" in str(exc.value)
    if bad.strip():
        assert bad.strip() not in str(exc.value)


def test_client_config_from_rollout_reads_the_named_variables() -> None:
    cfg = JobConfig()
    cfg.rollout.server.api_key_env = "MY_API_KEY"
    cfg.rollout.server.admin_api_key_env = "MY_ADMIN_KEY"
    client = ClientConfig.from_rollout(cfg.rollout, environ={"MY_API_KEY": API, "MY_ADMIN_KEY": ADMIN})
    assert (client.api_key, client.admin_api_key) == (API, ADMIN)
    with pytest.raises(ConfigError, match="MY_ADMIN_KEY is not set"):
        ClientConfig.from_rollout(cfg.rollout, environ={"MY_API_KEY": API})
    plain = ClientConfig.from_rollout(JobConfig().rollout, environ={})
    assert plain.api_key is None and plain.admin_api_key is None


def test_without_configured_keys_the_client_uses_the_jobs_generated_key() -> None:
    environ = {"AREAL_SERVER_ADMIN_KEY": ADMIN}
    cfg = JobConfig()
    client = ClientConfig.from_rollout(cfg.rollout, environ=environ)
    assert (client.api_key, client.admin_api_key) == (None, ADMIN)
    cfg.rollout.backend = "vllm"  # no admin key: the generated key is its API key
    client = ClientConfig.from_rollout(cfg.rollout, environ=environ)
    assert (client.api_key, client.admin_api_key) == (ADMIN, None)
    cfg.rollout.server.api_key_env = "MY_API_KEY"
    client = ClientConfig.from_rollout(cfg.rollout, environ={**environ, "MY_API_KEY": API})
    assert (client.api_key, client.admin_api_key) == (API, None)


def test_the_jobs_server_key_is_made_once_per_process(monkeypatch) -> None:
    from areal_tasks.api.run_dir import SERVER_ADMIN_KEY_ENV, ensure_server_admin_key

    monkeypatch.delenv(SERVER_ADMIN_KEY_ENV, raising=False)
    environ: dict[str, str] = {}
    ensure_server_admin_key(environ)
    key = environ[SERVER_ADMIN_KEY_ENV]
    assert len(key) >= 40
    ensure_server_admin_key(environ)
    assert environ[SERVER_ADMIN_KEY_ENV] == key  # restarts and later fleets of the job keep it
    other: dict[str, str] = {}
    ensure_server_admin_key(other)
    assert other[SERVER_ADMIN_KEY_ENV] != key  # a new job process, a new key


# -- launch: keys never on a command line, logs redacted ------------------------------------------


def _job(backend: str, allocation: str) -> JobConfig:
    cfg = JobConfig()
    cfg.allocation, cfg.rollout.backend = allocation, backend
    cfg.rollout.server.api_key_env = "MY_API_KEY"
    cfg.rollout.server.admin_api_key_env = "MY_ADMIN_KEY" if backend != "vllm" else None
    return cfg


def test_embedded_command_names_the_variables() -> None:
    cmd = build_server_command(_job("embedded", "embedded:d1+fsdp:d1"), "/models/m")
    argv = cmd.argv
    assert argv[argv.index("--api-key-env") + 1] == "MY_API_KEY"
    assert argv[argv.index("--admin-api-key-env") + 1] == "MY_ADMIN_KEY"
    assert "--api-key" not in argv and not cmd.env.get("VLLM_API_KEY")


def test_sglang_and_vllm_commands_run_under_with_keys() -> None:
    sglang = build_server_command(_job("sglang", "sglang:d1+fsdp:d1"), "/models/m").argv
    assert sglang[1:4] == ["-m", "areal_tasks.inference.launch.with_keys", "--flag"]
    assert "api-key=MY_API_KEY" in sglang and "admin-api-key=MY_ADMIN_KEY" in sglang
    assert sglang[sglang.index("sglang.launch_server") + 1] == "--model-path"
    vllm = build_server_command(_job("vllm", "vllm:d1+fsdp:d1"), "/models/m").argv
    assert vllm[vllm.index("--env") + 1] == "VLLM_API_KEY=MY_API_KEY"
    assert "vllm.entrypoints.openai.api_server" in vllm
    # a job's servers are never open: without configured keys, the job's generated key, by name
    no_keys = build_server_command(JobConfig(), "/models/m").argv
    assert "--api-key-env" not in no_keys
    assert no_keys[no_keys.index("--admin-api-key-env") + 1] == "AREAL_SERVER_ADMIN_KEY"
    sglang = build_server_command(_job("sglang", "sglang:d1+fsdp:d1"), "/models/m")
    assert "admin-api-key=MY_ADMIN_KEY" in sglang.argv
    generated = JobConfig()
    generated.allocation, generated.rollout.backend = "sglang:d1+fsdp:d1", "sglang"
    assert "admin-api-key=AREAL_SERVER_ADMIN_KEY" in build_server_command(generated, "/models/m").argv


def test_vllm_refuses_an_admin_key() -> None:
    cfg = _job("vllm", "vllm:d1+fsdp:d1")
    cfg.rollout.server.admin_api_key_env = "MY_ADMIN_KEY"
    with pytest.raises(ConfigError, match="vLLM has no admin key"):
        build_server_command(cfg, "/models/m")


def test_apply_keys() -> None:
    env = {"A": API, "B": ADMIN, "EMPTY": ""}
    args, new_env = apply_keys(["--model", "m"], [("api-key", "A")], [("VLLM_API_KEY", "B")], env)
    assert args == ["--model", "m", "--api-key", API] and new_env == {"VLLM_API_KEY": ADMIN}
    for missing in ("NOPE", "EMPTY"):
        with pytest.raises(KeyError, match=missing):
            apply_keys([], [("api-key", missing)], [], env)


def test_with_keys_adds_the_key_inside_the_process_only(tmp_path: Path) -> None:
    (tmp_path / "show_args.py").write_text(
        "import os, sys\n"
        "print(repr(sys.argv[1:]), os.environ.get('VLLM_API_KEY'), open('/proc/self/cmdline').read().count('SECRET'))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "K1": "SECRET-1",
        "K2": "SECRET-2",
    }
    argv = [
        sys.executable,
        "-m",
        "areal_tasks.inference.launch.with_keys",
        "--flag",
        "api-key=K1",
        "--env",
        "VLLM_API_KEY=K2",
        "show_args",
        "--port",
        "1",
    ]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out == ["['--port',", "'1',", "'--api-key',", "'SECRET-1']", "SECRET-2", "0"]
    env.pop("K1")
    failed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert failed.returncode == 2 and "environment variable K1" in failed.stderr and "not set" in failed.stderr


def test_redact_argv() -> None:
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--api-key",
        API,
        f"--admin-api-key={ADMIN}",
        "--hf-token",
        "t",
        "--api-key-env",
        "MY_API_KEY",
        "--tokenizer",
        "tok",
        "--max-tokens",
        "5",
    ]
    assert redact_argv(argv) == [
        "python",
        "-m",
        "sglang.launch_server",
        "--api-key",
        "***",
        "--admin-api-key=***",
        "--hf-token",
        "***",
        "--api-key-env",
        "MY_API_KEY",
        "--tokenizer",
        "tok",
        "--max-tokens",
        "5",
    ]


def test_spawn_log_redacts_keys(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="areal_tasks.launch.process"):
        proc = WorkerProcess.spawn(
            "w", [sys.executable, "-c", "pass", "--api-key", API], dict(os.environ), None, tmp_path / "w.log"
        )
        proc.popen.wait(timeout=30)
    assert "--api-key ***" in caplog.text and API not in caplog.text


def test_serve_resolve_key() -> None:
    assert resolve_key("k", None, "api-key", {}) == "k"
    assert resolve_key(None, "V", "api-key", {"V": API}) == API
    with pytest.raises(ConfigError, match="V is not set"):
        resolve_key(None, "V", "api-key", {})
    with pytest.raises(ConfigError, match="not both"):
        resolve_key("k", "V", "api-key", {"V": API})
