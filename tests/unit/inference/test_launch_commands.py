"""Server command lines built from a JobConfig: SGLang, vLLM and the embedded server.

A job's servers always get an admin key (the job's generated ``AREAL_SERVER_ADMIN_KEY`` unless the
config names one; vLLM's API key, as it has no admin key), named on the command line, never given,
and the run's ``weights/`` as a weight root.
"""

from __future__ import annotations

import argparse
import os
import sys

import pytest

from areal_tasks.config.job import JobConfig
from areal_tasks.errors import ConfigError
from areal_tasks.inference.launch import ServerFleet, build_server_command, server_layout
from areal_tasks.launch import LocalScheduler


def config(allocation: str, backend: str) -> JobConfig:
    cfg = JobConfig()
    cfg.allocation = allocation
    cfg.rollout.backend = backend
    cfg.rollout.server.python = "/envs/serve/bin/python"
    cfg.rollout.server.mem_fraction = 0.7
    cfg.rollout.server.context_length = 4096
    cfg.rollout.server.dtype = "bfloat16"
    cfg.rollout.server.extra_args = ["--log-level", "warning"]
    cfg.experiment.seed = 7
    return cfg


def test_sglang_command() -> None:
    cfg = config("sglang:d2t4p2+fsdp:d8", "sglang")
    cfg.model.trust_remote_code = True
    cmd = build_server_command(cfg, "/models/qwen")
    assert cmd.argv == [
        "/envs/serve/bin/python",
        "-m",
        "areal_tasks.inference.launch.with_keys",
        "--flag",
        "admin-api-key=AREAL_SERVER_ADMIN_KEY",
        "sglang.launch_server",
        "--model-path",
        "/models/qwen",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--tp-size",
        "4",
        "--pp-size",
        "2",
        "--mem-fraction-static",
        "0.7",
        "--dtype",
        "bfloat16",
        "--context-length",
        "4096",
        "--random-seed",
        "7",
        "--trust-remote-code",
        "--weight-version",
        "0",
        "--log-level",
        "warning",
    ]
    assert cmd.health_path == "/health"
    assert server_layout(cfg).n_servers == 2 and server_layout(cfg).devices_per_server == 8


def test_vllm_command_uses_its_own_python() -> None:
    cfg = config("vllm:d1t2+fsdp:d2", "vllm")
    cfg.model.tokenizer_path = "/models/tok"
    cmd = build_server_command(cfg, "/models/qwen")
    assert cmd.argv == [
        "/envs/serve/bin/python",
        "-m",
        "areal_tasks.inference.launch.with_keys",
        "--env",
        "VLLM_API_KEY=AREAL_SERVER_ADMIN_KEY",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/qwen",
        "--tokenizer",
        "/models/tok",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--tensor-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.7",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--seed",
        "7",
        "--weight-transfer-config",
        '{"backend": "areal"}',
        "--logprobs-mode",
        "processed_logprobs",
        "--log-level",
        "warning",
    ]
    assert cmd.env == {
        "VLLM_SERVER_DEV_MODE": "1",
        "AREAL_WEIGHT_ROOTS": os.path.abspath("weights"),
        "PYTHONSAFEPATH": "1",
    }


def test_embedded_command_defaults_to_this_python_and_model_dtype() -> None:
    cfg = JobConfig()
    cfg.model.dtype = "float32"
    cmd = build_server_command(cfg, "/models/tiny", weight_version=3)
    assert cmd.argv == [
        sys.executable,
        "-m",
        "areal_tasks.cli",
        "serve",
        "--model",
        "/models/tiny",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--dtype",
        "float32",
        "--seed",
        "1",
        "--weight-version",
        "3",
        "--admin-api-key-env",
        "AREAL_SERVER_ADMIN_KEY",
        "--max-queued-sequences",
        "256",
        "--max-n",
        "64",
        "--weight-root",
        os.path.abspath("weights"),
    ]


def test_embedded_servers_get_limits_above_what_the_rollout_sends() -> None:
    """The job's servers never answer its own rollout 429/413: their queue holds every attempt the
    client can have in flight (four times over) and n covers a group; `areal serve` parses them."""
    from areal_tasks.cli.serve_cmd import register
    from areal_tasks.inference.server.limits import limits_from_args

    cfg = JobConfig()
    cfg.rollout.max_concurrent_rollouts, cfg.rollout.group_size = 200, 100
    cmd = build_server_command(cfg, "/models/tiny")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args([a.replace("{host}", "h").replace("{port}", "1") for a in cmd.argv[3:]])
    limits = limits_from_args(args)
    assert limits.max_queued_sequences == 4 * 200 and limits.max_n == 100
    cfg.rollout.server.extra_args = ["--max-queued-sequences", "5000"]  # a user's own value wins
    args = parser.parse_args(
        [a.replace("{host}", "h").replace("{port}", "1") for a in build_server_command(cfg, "/m").argv[3:]]
    )
    assert limits_from_args(args).max_queued_sequences == 5000


def test_weight_roots_are_the_runs_weights_and_the_configured_ones(tmp_path) -> None:
    cfg = JobConfig()
    cfg.experiment.run_dir = str(tmp_path / "run")
    cfg.rollout.server.weight_roots = ["/data/weights", "relative"]
    argv = build_server_command(cfg, "/models/tiny").argv
    roots = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--weight-root"]
    assert roots == [str(tmp_path / "run" / "weights"), "/data/weights", os.path.abspath("relative")]
    vllm = config("vllm:d1+fsdp:d1", "vllm")
    vllm.experiment.run_dir = str(tmp_path / "run")
    env = build_server_command(vllm, "/m").env["AREAL_WEIGHT_ROOTS"]
    assert env.split(os.pathsep) == [str(tmp_path / "run" / "weights")]


def test_embedded_refuses_model_parallel_layouts() -> None:
    with pytest.raises(ConfigError, match="tp=2"):
        build_server_command(config("embedded:d1t2+fsdp:d1", "embedded"), "/m")


def test_fleet_from_config(tmp_path) -> None:
    cfg = config("sglang:d3t2+fsdp:d2", "sglang")
    cfg.cluster.gpus_per_node = 8
    cfg.rollout.server.max_restarts = 5
    fleet = ServerFleet.from_config(LocalScheduler(tmp_path, devices=[], handle_signals=False), cfg, "/m")
    assert fleet.n_servers == 3 and fleet.max_restarts == 5
    spec = fleet._spec(1)
    assert spec.name == "inference-1" and spec.devices_per_worker == 2 and not spec.hide_devices
    assert spec.readiness.target == "http://{host}:{port}/health" and "sglang.launch_server" in spec.command
    cpu = ServerFleet.from_config(LocalScheduler(tmp_path, devices=[], handle_signals=False), JobConfig(), "/m")
    assert cpu._spec(0).devices_per_worker == 0 and cpu._spec(0).hide_devices


@pytest.mark.parametrize("scheduler", ["slurm", "ray"])
def test_servers_of_a_cluster_scheduler_get_the_job_key_as_their_api_key(scheduler: str) -> None:
    """Found by ``areal train cluster.scheduler=slurm cluster.nodes=2``: the servers bind their node's
    address and ``areal serve`` refused to start without an API key, so the job never ran."""
    from areal_tasks.api.run_dir import SERVER_ADMIN_KEY_ENV
    from areal_tasks.inference.launch.commands import key_servers_off_loopback

    cfg = config("embedded:d1+fsdp:d2", "embedded")
    cfg.cluster.scheduler = scheduler
    environ: dict[str, str] = {}
    keyed = key_servers_off_loopback(cfg, environ)
    assert keyed.rollout.server.api_key_env == SERVER_ADMIN_KEY_ENV and environ[SERVER_ADMIN_KEY_ENV]
    argv = build_server_command(keyed, "/m").argv
    assert argv[argv.index("--api-key-env") + 1] == SERVER_ADMIN_KEY_ENV
    assert environ[SERVER_ADMIN_KEY_ENV] not in argv
    assert keyed.rollout.server.read_keys(environ)[0] == environ[SERVER_ADMIN_KEY_ENV]  # the clients send it
    assert cfg.rollout.server.api_key_env is None  # the caller's config is left as it was


def test_local_servers_and_a_configured_api_key_are_left_alone() -> None:
    from areal_tasks.inference.launch.commands import key_servers_off_loopback

    local = config("embedded:d1+fsdp:d2", "embedded")
    environ: dict[str, str] = {}
    assert key_servers_off_loopback(local, environ) is local and not environ
    own = config("embedded:d1+fsdp:d2", "embedded")
    own.cluster.scheduler = "slurm"
    own.rollout.server.api_key_env = "MY_KEY"
    assert key_servers_off_loopback(own, environ) is own and not environ
