"""Build and run the embedded server: ``ServerConfig`` -> model runner -> engine -> FastAPI on uvicorn.

:func:`build_app` loads the model and starts the engine thread (the app's lifespan stops it);
:func:`run_server` serves it until SIGINT/SIGTERM. ``areal serve`` (``cli/serve_cmd.py``) is the
command-line front end.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.limits import ServerLimits

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerConfig:
    """Everything ``areal serve`` takes."""

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "auto"
    device: str = "auto"
    max_running_requests: int = 32
    context_length: int | None = None
    max_prefill_tokens: int = 8192
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    #: the initial ``weight_version`` (SGLang's ``--weight-version``; an integer keeps bumps numeric).
    weight_version: str = "0"
    api_key: str | None = None
    admin_api_key: str | None = None
    tool_call_parser: str | None = None
    #: on CUDA, replay decode steps from CUDA graphs (SGLang's --disable-cuda-graph turns it off).
    cuda_graphs: bool = True
    #: on CUDA, torch.compile the norms and MLPs (``areal_tasks.models.compile``).
    torch_compile: bool = True
    #: what CUDA-graph decode steps compile: ``blocks`` (whole decoder blocks) or ``pointwise``
    #: (norms and MLPs); see ``RunnerConfig.compile_scope``.
    torch_compile_scope: str = "blocks"
    #: the grouped decode attention: ``auto``, ``triton`` or ``sdpa``; see ``RunnerConfig.decode_attention``.
    decode_attention: str = "auto"
    #: launch each decode step before reading the previous one back (SGLang's overlap scheduler;
    #: its --disable-overlap-schedule turns it off).
    overlap_schedule: bool = True
    #: seed of the shared sampling stream (unseeded requests); None = nondeterministic.
    seed: int | None = None
    #: CPU intra-op threads for torch; None keeps torch's default.
    num_threads: int | None = None
    log_level: str = "info"
    #: what one request may ask (``limits.py``: n, prompts, queue, body, prompt text, tokenizing time).
    limits: ServerLimits = field(default_factory=ServerLimits)

    def __post_init__(self) -> None:
        from areal_tasks.inference.server.openai_routes import TOOL_CALL_PARSERS

        if not 0 < self.port < 65536:
            raise InferenceError(f"port must be in 1..65535, got {self.port}")
        if self.max_running_requests < 1:
            raise InferenceError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise InferenceError(f"tool_call_parser must be one of {TOOL_CALL_PARSERS}, got {self.tool_call_parser!r}")


def build_app(cfg: ServerConfig) -> Any:
    """Load the model, start the engine and return the FastAPI app serving it."""
    import torch

    from areal_tasks.inference.server.app import create_app
    from areal_tasks.inference.server.cuda_graph import build_runner
    from areal_tasks.inference.server.engine import Engine
    from areal_tasks.inference.server.model_runner import RunnerConfig
    from areal_tasks.inference.server.service import EmbeddedServer

    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    runner = build_runner(
        RunnerConfig(
            model_path=cfg.model_path,
            dtype=cfg.dtype,
            device=cfg.device,
            max_running_requests=cfg.max_running_requests,
            context_length=cfg.context_length,
            tokenizer_path=cfg.tokenizer_path,
            cuda_graphs=cfg.cuda_graphs,
            torch_compile=cfg.torch_compile,
            compile_scope=cfg.torch_compile_scope,
            decode_attention=cfg.decode_attention,
        )
    )
    engine = Engine(
        runner,
        weight_version=cfg.weight_version,
        max_prefill_tokens=cfg.max_prefill_tokens,
        overlap=cfg.overlap_schedule,
    )
    name = cfg.served_model_name or Path(cfg.model_path).name
    server = EmbeddedServer(engine, cfg.model_path, name, tool_call_parser=cfg.tool_call_parser, limits=cfg.limits)
    app = create_app(server, api_key=cfg.api_key, admin_api_key=cfg.admin_api_key)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.shutdown()
            server.close()

    app.router.lifespan_context = lifespan
    return app


def run_server(cfg: ServerConfig) -> None:
    """Serve until interrupted."""
    import uvicorn

    app = build_app(cfg)
    logger.info("serving %s on http://%s:%d", cfg.model_path, cfg.host, cfg.port)
    # a long keep-alive: clients reuse connections between generation bursts (see the client transport)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False, timeout_keep_alive=75)
