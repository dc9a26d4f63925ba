"""Command lines of the inference servers, built from the job config (one builder per backend).

:func:`server_layout` reads the inference component of the allocation (``sglang:d2t4`` = 2 servers
of tensor-parallel size 4); :func:`build_server_command` turns ``rollout.server`` and ``model``
into the argv of one server, with the Scheduler's ``{host}``/``{port}`` placeholders left in.
The interpreter is ``rollout.server.python`` (e.g. a separate vLLM venv) or the current one.

API keys (``rollout.server.api_key_env``/``admin_api_key_env`` name environment variables) never
appear on a command line: the embedded server gets ``--api-key-env NAME``; SGLang and vLLM, which
take a key only as ``--api-key KEY`` (vLLM also as ``$VLLM_API_KEY``), run under
:mod:`.with_keys`, which adds the key inside the server process. The variables reach the servers
because the Scheduler passes its environment on (the LocalScheduler does). A job's servers always
have an admin key: without ``admin_api_key_env`` it is the one the job generates
(``AREAL_SERVER_ADMIN_KEY``, made by ``ServerFleet.start``); vLLM, which has no admin key, gets it
as its API key unless ``api_key_env`` is set (:meth:`InferenceServerConfig.key_envs`).

Weight roots: a server loads disk updates only from the served model's directory, the run's
``weights/`` and ``rollout.server.weight_roots`` (``--weight-root DIR``; vLLM's plugin reads them
from ``$AREAL_WEIGHT_ROOTS``).

Request limits: the embedded server refuses what passes its limits (``--max-queued-sequences``:
429, ``--max-n``: 413; ``inference/server/limits.py``). A job's servers get limits above anything
its rollout can send (:func:`job_queue_bound`), so training never meets them.

Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from areal_tasks.api.run_dir import SERVER_ADMIN_KEY_ENV, RunPaths, ensure_server_admin_key
from areal_tasks.errors import ConfigError
from areal_tasks.weights.roots import WEIGHT_ROOTS_ENV

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = [
    "ServerArgs",
    "ServerCommand",
    "ServerLayout",
    "build_server_command",
    "job_queue_bound",
    "key_servers_off_loopback",
    "server_args",
    "server_layout",
]

#: ``areal serve``'s own defaults, below which a job never sets its servers' limits.
SERVER_DEFAULT_QUEUE, SERVER_DEFAULT_MAX_N = 256, 64


def key_servers_off_loopback(cfg: JobConfig, environ: MutableMapping[str, str]) -> JobConfig:
    """``cfg`` with an API key for servers that bind a node's address instead of loopback.

    A cluster scheduler (any kind but ``local``) starts the servers on its nodes, reached at the
    node's address, and ``areal serve`` refuses a non-loopback ``--host`` without an API key. When
    ``rollout.server.api_key_env`` is unset there, the job's generated server key
    (``AREAL_SERVER_ADMIN_KEY``, made in ``environ`` now when absent) becomes their API key too; the
    servers, the train workers and their clients inherit it through the environment (never argv).
    vLLM already takes the generated key as its API key (:meth:`InferenceServerConfig.key_envs`).
    """
    server = cfg.rollout.server
    if cfg.cluster.scheduler == "local" or server.api_key_env is not None or cfg.rollout.backend == "vllm":
        return cfg
    ensure_server_admin_key(environ)
    keyed = dataclasses.replace(server, api_key_env=SERVER_ADMIN_KEY_ENV)
    return dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, server=keyed))


def job_queue_bound(max_concurrent_rollouts: int) -> int:
    """The embedded server's ``--max-queued-sequences`` for a job: every attempt the rollout has in
    flight may land on one server (the others down or restarting), the evaluation's as many again
    (its own event loop, its own cap), and attempts abandoned by a timeout stay queued until their
    abort arrives: four times the cap covers them all, and never less than the server's default."""
    return max(SERVER_DEFAULT_QUEUE, 4 * max_concurrent_rollouts)


@dataclass(frozen=True)
class ServerLayout:
    """How many servers there are and the parallel sizes of each."""

    n_servers: int
    tp: int = 1
    pp: int = 1
    ep: int = 1

    @property
    def devices_per_server(self) -> int:
        """Accelerators one server spans (tp * pp)."""
        return self.tp * self.pp


@dataclass(frozen=True)
class ServerArgs:
    """Everything a server's command line is made of (backend-neutral)."""

    backend: str
    python: str
    model_path: str
    tokenizer_path: str | None
    dtype: str
    mem_fraction: float
    context_length: int | None
    seed: int
    trust_remote_code: bool
    layout: ServerLayout
    #: policy version of the weights at ``model_path`` (reported by the server until the first update).
    weight_version: int = 0
    extra_args: tuple[str, ...] = ()
    #: names of the environment variables holding the API key and the admin API key (None = none).
    api_key_env: str | None = None
    admin_api_key_env: str | None = None
    #: what the rollout can send a server: requests in flight at once (rollout.max_concurrent_rollouts)
    #: and samples per prompt (rollout.group_size); the embedded server's limits are sized above them.
    max_concurrent_requests: int = 0
    samples_per_prompt: int = 1
    #: directories weight updates may be read from besides ``model_path`` (absolute).
    weight_roots: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerCommand:
    """One server's argv (with ``{host}``/``{port}`` placeholders), environment and health path."""

    backend: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"


def server_layout(cfg: JobConfig) -> ServerLayout:
    """The inference layout of ``cfg.allocation`` (exactly one inference component)."""
    from areal_tasks.config.allocation import parse_allocation

    inference = parse_allocation(cfg.allocation).inference()
    if len(inference) != 1:
        raise ConfigError(
            f"allocation {cfg.allocation!r} has {len(inference)} inference components; the server fleet "
            "serves exactly one (e.g. 'sglang:d2t2+fsdp:d4')"
        )
    dims = inference[0].dims
    return ServerLayout(n_servers=dims.d, tp=dims.t, pp=dims.p, ep=dims.e)


def server_args(
    cfg: JobConfig, model_path: str, layout: ServerLayout | None = None, weight_version: int = 0
) -> ServerArgs:
    """The backend-neutral server arguments of ``cfg`` for the model directory ``model_path``
    holding the weights of policy version ``weight_version``."""
    server = cfg.rollout.server
    dtype = server.dtype if server.dtype != "auto" else cfg.model.dtype
    api_key_env, admin_api_key_env = server.key_envs(cfg.rollout.backend)
    roots = [RunPaths.of(cfg.experiment.run_dir).weights, *server.weight_roots]
    return ServerArgs(
        backend=cfg.rollout.backend,
        python=server.python or sys.executable,
        model_path=model_path,
        tokenizer_path=cfg.model.tokenizer_path,
        dtype=dtype,
        mem_fraction=server.mem_fraction,
        context_length=server.context_length,
        seed=cfg.experiment.seed,
        trust_remote_code=cfg.model.trust_remote_code,
        layout=layout or server_layout(cfg),
        weight_version=weight_version,
        extra_args=tuple(server.extra_args),
        max_concurrent_requests=cfg.rollout.max_concurrent_rollouts,
        samples_per_prompt=cfg.rollout.group_size,
        api_key_env=api_key_env,
        admin_api_key_env=admin_api_key_env,
        weight_roots=tuple(os.path.abspath(root) for root in roots),
    )


def _common(flags: dict[str, object]) -> list[str]:
    """``--flag value`` pairs of the values that are set (``True`` = a bare flag, None/False = absent)."""
    argv: list[str] = []
    for flag, value in flags.items():
        if value is None or value is False:
            continue
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def _with_keys(
    module: str, *, flags: dict[str, str | None] | None = None, envs: dict[str, str | None] | None = None
) -> list[str]:
    """What follows ``python -m`` to run ``module`` with the keys of the named environment variables
    added as ``--FLAG KEY`` (``flags``: FLAG -> NAME) or as variables (``envs``: TARGET -> NAME), by
    :mod:`.with_keys`; just ``[module]`` when no variable is named."""
    options: list[str] = []
    for option, pairs in (("--flag", flags or {}), ("--env", envs or {})):
        options += [part for target, name in pairs.items() if name is not None for part in (option, f"{target}={name}")]
    return ["areal_tasks.inference.launch.with_keys", *options, module] if options else [module]


def sglang_command(a: ServerArgs) -> ServerCommand:
    """``python -m sglang.launch_server`` (flags as in sglang 0.5.23 ``server_args``)."""
    flags = {
        "--model-path": a.model_path,
        "--tokenizer-path": a.tokenizer_path,
        "--host": "{host}",
        "--port": "{port}",
        "--tp-size": a.layout.tp,
        "--pp-size": a.layout.pp if a.layout.pp > 1 else None,
        "--ep-size": a.layout.ep if a.layout.ep > 1 else None,
        "--mem-fraction-static": a.mem_fraction,
        "--dtype": a.dtype,
        "--context-length": a.context_length,
        "--random-seed": a.seed,
        "--trust-remote-code": a.trust_remote_code,
        "--weight-version": a.weight_version,
    }
    keys = {"api-key": a.api_key_env, "admin-api-key": a.admin_api_key_env}
    argv = [a.python, "-m", *_with_keys("sglang.launch_server", flags=keys), *_common(flags), *a.extra_args]
    return ServerCommand("sglang", argv)


def vllm_command(a: ServerArgs) -> ServerCommand:
    """``python -m vllm.entrypoints.openai.api_server`` (vLLM's OpenAI server)."""
    flags = {
        "--model": a.model_path,
        "--tokenizer": a.tokenizer_path,
        "--host": "{host}",
        "--port": "{port}",
        "--tensor-parallel-size": a.layout.tp,
        "--pipeline-parallel-size": a.layout.pp if a.layout.pp > 1 else None,
        "--enable-expert-parallel": a.layout.ep > 1,
        "--gpu-memory-utilization": a.mem_fraction,
        "--dtype": a.dtype,
        "--max-model-len": a.context_length,
        "--seed": a.seed,
        "--trust-remote-code": a.trust_remote_code,
        # our weight-transfer engine (areal_tasks.inference.vllm_plugin): disk and gloo updates on CPU
        "--weight-transfer-config": json.dumps({"backend": "areal"}),
        # logprobs after temperature/top-p, as SGLang and the embedded server report them
        "--logprobs-mode": "processed_logprobs",
    }
    if a.admin_api_key_env is not None:
        raise ConfigError(
            f"rollout.server.admin_api_key_env={a.admin_api_key_env!r}: vLLM has no admin key (its --api-key "
            "guards only the /v1 routes); leave it null"
        )
    module = _with_keys("vllm.entrypoints.openai.api_server", envs={"VLLM_API_KEY": a.api_key_env})
    argv = [a.python, "-m", *module, *_common(flags), *a.extra_args]
    env = {
        # dev-mode endpoints (pause/resume, weight updates) are what RL needs
        "VLLM_SERVER_DEV_MODE": "1",
        # where our plugin may load disk updates from, besides the served model (vLLM's key guards only /v1)
        WEIGHT_ROOTS_ENV: os.pathsep.join(a.weight_roots),
        # keep the working directory off sys.path, where a stale egg-info could hide the plugin
        "PYTHONSAFEPATH": "1",
    }
    return ServerCommand("vllm", argv, env=env)


def embedded_command(a: ServerArgs) -> ServerCommand:
    """``python -m areal_tasks.cli serve`` (the embedded SGLang-protocol server)."""
    if a.layout.devices_per_server != 1 or a.layout.ep != 1:
        raise ConfigError(
            f"the embedded server runs one process per server; allocation inference dims tp={a.layout.tp}, "
            f"pp={a.layout.pp}, ep={a.layout.ep} must all be 1 (use sglang or vllm for model parallel serving)"
        )
    flags = {
        "--model": a.model_path,
        "--tokenizer": a.tokenizer_path,
        "--host": "{host}",
        "--port": "{port}",
        "--dtype": a.dtype,
        "--context-length": a.context_length,
        "--seed": a.seed,
        "--weight-version": a.weight_version,
        # the server reads the keys from these variables: only the names are on the command line
        "--api-key-env": a.api_key_env,
        "--admin-api-key-env": a.admin_api_key_env,
        # limits above what the rollout sends (extra_args come later, so a user's own value wins)
        "--max-queued-sequences": job_queue_bound(a.max_concurrent_requests),
        "--max-n": max(SERVER_DEFAULT_MAX_N, a.samples_per_prompt),
    }
    roots = [part for root in a.weight_roots for part in ("--weight-root", root)]
    argv = [a.python, "-m", "areal_tasks.cli", "serve", *_common(flags), *roots, *a.extra_args]
    return ServerCommand("embedded", argv)


def build_server_command(
    cfg: JobConfig, model_path: str, layout: ServerLayout | None = None, weight_version: int = 0
) -> ServerCommand:
    """The command of one ``cfg.rollout.backend`` server serving ``model_path`` (weights of
    ``weight_version``: the server reports it, so tokens are tagged right until the first update).
    The backend's builder (one of the functions above) is found through the inference registry."""
    from areal_tasks.inference.registry import server_command_builder
    from areal_tasks.trace.env import trace_environment

    args = server_args(cfg, model_path, layout, weight_version)
    command = server_command_builder(args.backend)(args)
    traced = trace_environment(cfg)  # the embedded server records spans; other backends ignore it
    return dataclasses.replace(command, env={**command.env, **traced}) if traced else command
