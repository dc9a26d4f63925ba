"""Build and run the embedded server: ``ServerConfig`` -> model runner -> engine -> FastAPI on uvicorn.

:func:`build_app` loads the model and starts the engine thread (the app's lifespan stops it, and
leaves the weight-update groups, both bounded); :func:`run_server` serves it until SIGINT/SIGTERM
and ends within ``shutdown_timeout_s`` of the signal (``shutdown.py``), with the interpreter's
switch interval at ``switch_interval_us`` (:data:`DEFAULT_SWITCH_INTERVAL_US`). Admin routes are closed
without a key unless ``allow_unauthenticated_admin`` (``auth.py``). ``areal serve``
(``cli/serve_cmd.py``) is the command-line front end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.images import DEFAULT_IMAGE_CACHE_MB
from areal_tasks.inference.server.limits import ServerLimits

logger = logging.getLogger(__name__)

#: The interpreter's switch interval while serving, in microseconds. The engine thread and the
#: HTTP event loop share one interpreter lock, and every torch call (a kernel launch on CUDA)
#: gives it up and takes it back. While the event loop runs Python (a burst of requests arriving,
#: answers written), taking it back waits until the loop is made to drop it, which CPython does
#: once the waiter has waited a whole switch interval: 5 ms by default, so one torch call went
#: through per 5 ms and an admission prefill of hundreds of launches took a second.
#: ``benchmarks/gil_convoy.py`` measures it (CPU, docs/benchmarks.md): a call beside a thread
#: running Python costs 4,028 us at 5 ms, 70 us at 100 us, 48 us at 20 us (3-4 us alone), and
#: the Python thread's rate stays within the run's noise of its rate alone. The default stays
#: Python's 5 ms until an H200 run measures a shorter one and a CI failure with 100 us is
#: understood (docs/embedded_server.md, "The HTTP front end and the interpreter lock").
DEFAULT_SWITCH_INTERVAL_US = 5000.0
MIN_SWITCH_INTERVAL_US = 1.0
MAX_SWITCH_INTERVAL_US = 1_000_000.0
#: where HTTP runs (``ServerConfig.http_frontend``).
HTTP_FRONTENDS = ("inline", "process")


@dataclass(frozen=True)
class WeightBounds:
    """Where weight updates may read from and how long each weight operation may take."""

    #: directories weight loads may read from besides the served model's (``--weight-root``).
    roots: tuple[str, ...] = ()
    #: seconds a weight-update group's rendezvous may take (``--weight-group-timeout-s``).
    group_timeout_s: float = 60.0
    #: seconds a weight load (disk or shared staging, one received bucket) may take, and the
    #: group's operation timeout (``--weight-load-timeout-s``).
    load_timeout_s: float = 600.0
    #: seconds an update on a server that is not paused waits for the requests in flight before it
    #: fails and lets new requests in again (``--weight-update-drain-timeout-s``).
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("group_timeout_s", "load_timeout_s", "drain_timeout_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise InferenceError(f"{name} must be a positive number of seconds, got {value!r}")


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
    #: host memory (MiB) for processed images by content; see ``RunnerConfig.image_cache_mb``.
    image_cache_mb: int = DEFAULT_IMAGE_CACHE_MB
    #: launch each decode step before reading the previous one back (SGLang's overlap scheduler;
    #: its --disable-overlap-schedule turns it off).
    overlap_schedule: bool = True
    #: keep finished sequences' KV in free slots and reuse cached prompt prefixes (``prefix_cache.py``);
    #: off by default until its cost on GPUs is understood (``engine.py``, docs/inference.md).
    prefix_cache: bool = False
    #: seed of the shared sampling stream (unseeded requests); None = nondeterministic.
    seed: int | None = None
    #: CPU intra-op threads for torch; None keeps torch's default.
    num_threads: int | None = None
    log_level: str = "info"
    #: what one request may ask (``limits.py``: n, prompts, queue, body, prompt text, tokenizing time).
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: weight roots and the bounds of weight operations.
    weights: WeightBounds = field(default_factory=WeightBounds)
    #: without an API key or admin key, admin routes are open (else they are refused).
    allow_unauthenticated_admin: bool = False
    #: seconds from SIGTERM/SIGINT to the process's exit at most (hung threads included).
    shutdown_timeout_s: float = 15.0
    #: where HTTP is parsed and answered: ``inline`` (uvicorn in this process, beside the engine
    #: thread) or ``process`` (a front-end process of its own, bridged to this one: frontend.py).
    http_frontend: str = "inline"
    #: the interpreter's thread switch interval while serving (``sys.setswitchinterval``, in
    #: microseconds): how long the engine thread waits for the interpreter lock after each torch
    #: call while the HTTP event loop runs Python (see :data:`DEFAULT_SWITCH_INTERVAL_US`).
    switch_interval_us: float = DEFAULT_SWITCH_INTERVAL_US

    def __post_init__(self) -> None:
        from areal_tasks.agent.tool_calls import TOOL_CALL_PARSERS

        if not 0 < self.port < 65536:
            raise InferenceError(f"port must be in 1..65535, got {self.port}")
        if self.max_running_requests < 1:
            raise InferenceError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if isinstance(self.image_cache_mb, bool) or not isinstance(self.image_cache_mb, int) or self.image_cache_mb < 0:
            raise InferenceError(
                f"image_cache_mb must be a whole number of MiB >= 0 (0 turns the image cache off), "
                f"got {self.image_cache_mb!r}"
            )
        if self.tool_call_parser not in (None, *TOOL_CALL_PARSERS):
            raise InferenceError(f"tool_call_parser must be one of {TOOL_CALL_PARSERS}, got {self.tool_call_parser!r}")
        if not 0 < self.shutdown_timeout_s < float("inf"):
            raise InferenceError(
                f"shutdown_timeout_s must be a positive number of seconds, got {self.shutdown_timeout_s}"
            )
        if self.http_frontend not in HTTP_FRONTENDS:
            raise InferenceError(f"http_frontend must be one of {HTTP_FRONTENDS}, got {self.http_frontend!r}")
        if not MIN_SWITCH_INTERVAL_US <= self.switch_interval_us <= MAX_SWITCH_INTERVAL_US:
            raise InferenceError(
                f"switch_interval_us must be {MIN_SWITCH_INTERVAL_US:g}..{MAX_SWITCH_INTERVAL_US:g} microseconds "
                f"(Python's default is 5000), got {self.switch_interval_us}"
            )


def vision_model(model_path: str) -> bool:
    """Whether ``model_path`` holds a vision-language model (its config has a ``vision_config``)."""
    config = Path(model_path).expanduser() / "config.json"
    if not config.is_file():
        return False  # the runner says what is wrong with the directory
    try:
        return "vision_config" in json.loads(config.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise InferenceError(f"{config}: cannot read the model's config ({exc})") from exc


def build_app(cfg: ServerConfig) -> Any:
    """Load the model, start the engine and return the FastAPI app serving it."""
    import torch

    from areal_tasks.inference.server.app import create_app
    from areal_tasks.inference.server.auth import install_api_keys
    from areal_tasks.inference.server.cuda_graph import build_runner
    from areal_tasks.inference.server.engine import Engine
    from areal_tasks.inference.server.model_runner import RunnerConfig
    from areal_tasks.inference.server.service import EmbeddedServer

    if cfg.num_threads is not None:
        torch.set_num_threads(cfg.num_threads)
    if cfg.seed is not None:
        torch.manual_seed(cfg.seed)
    eager = vision_model(cfg.model_path)
    if eager and (cfg.cuda_graphs or cfg.torch_compile):
        logger.info(
            "%s is a vision-language model: its decode runs eagerly, without CUDA graphs or torch.compile "
            "(each row's multimodal rotary positions are not part of the captured steps)",
            cfg.model_path,
        )
    runner = build_runner(
        RunnerConfig(
            model_path=cfg.model_path,
            dtype=cfg.dtype,
            device=cfg.device,
            max_running_requests=cfg.max_running_requests,
            context_length=cfg.context_length,
            tokenizer_path=cfg.tokenizer_path,
            cuda_graphs=cfg.cuda_graphs and not eager,
            torch_compile=cfg.torch_compile and not eager,
            compile_scope=cfg.torch_compile_scope,
            decode_attention=cfg.decode_attention,
            image_cache_mb=cfg.image_cache_mb,
        )
    )
    engine = Engine(
        runner,
        weight_version=cfg.weight_version,
        max_prefill_tokens=cfg.max_prefill_tokens,
        overlap=cfg.overlap_schedule,
        prefix_cache=cfg.prefix_cache,
    )
    name = cfg.served_model_name or Path(cfg.model_path).name
    server = EmbeddedServer(
        engine,
        cfg.model_path,
        name,
        tool_call_parser=cfg.tool_call_parser,
        limits=cfg.limits,
        weight_bounds=cfg.weights,
    )
    app = create_app(server)
    install_api_keys(app, cfg.api_key, cfg.admin_api_key, open_admin=cfg.allow_unauthenticated_admin)
    _answer_weight_bounds(app)
    # the stop's budget (shutdown.py): a third to requests in flight (uvicorn), then the engine and the groups
    stop_s = cfg.shutdown_timeout_s / 3

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            try:
                engine.shutdown(timeout=stop_s)
            finally:
                server.close(timeout_s=stop_s / 2)

    app.router.lifespan_context = lifespan
    return app


def _answer_weight_bounds(app: Any) -> None:
    """Weight operations refused or cut short by a bound answer its status (409, 503, 504) with
    SGLang's ``{"success": false, "message"}`` body."""
    from fastapi.responses import JSONResponse

    from areal_tasks.inference.server.weight_guard import WeightOperationError

    async def refused(_: Any, exc: Exception) -> JSONResponse:
        status = exc.status if isinstance(exc, WeightOperationError) else 500
        return JSONResponse({"success": False, "message": str(exc)}, status_code=status)

    app.add_exception_handler(WeightOperationError, refused)


def _http_stack() -> str:
    """Which event loop and HTTP parser uvicorn picks here ("auto": uvloop and httptools when
    installed, as the serve extra installs them; asyncio and h11 otherwise, slower per request)."""
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    parser = "httptools" if importlib.util.find_spec("httptools") else "h11"
    return f"event loop {loop}, HTTP parser {parser}"


def run_server(cfg: ServerConfig) -> None:
    """Serve until SIGTERM/SIGINT; the process ends within ``cfg.shutdown_timeout_s`` of the signal,
    hung threads or not (``shutdown.py``: it may end the process itself)."""
    from areal_tasks.gc_heap import freeze_startup_heap
    from areal_tasks.inference.server.shutdown import serve_until_stopped
    from areal_tasks.trace import configure_from_env, uninstall

    configure_from_env(f"server :{cfg.port}")  # a job's fleet names it "server <index>"
    app = build_app(cfg)
    freeze_startup_heap()  # the model, compiled graphs and routes: never traversed by a collection again
    saved_interval = sys.getswitchinterval()
    sys.setswitchinterval(cfg.switch_interval_us / 1e6)  # see DEFAULT_SWITCH_INTERVAL_US
    app.state.http_frontend = cfg.http_frontend
    uvicorn_bind: dict[str, Any] = {"host": cfg.host, "port": cfg.port}
    front_end = None
    if cfg.http_frontend == "process":
        from areal_tasks.inference.server.frontend_process import HttpFrontEnd, install_front_end

        front_end = HttpFrontEnd(
            cfg.host,
            cfg.port,
            max_body_bytes=app.state.server.limits.max_body_bytes,
            shutdown_timeout_s=cfg.shutdown_timeout_s,
            log_level=cfg.log_level,
        )
        install_front_end(app, front_end, stop_timeout_s=cfg.shutdown_timeout_s / 3)
        uvicorn_bind = {"uds": front_end.engine_socket, "on_serving": front_end.set_stopper}
    logger.info(
        "serving %s on http://%s:%d (%s, switch interval %g us, HTTP front end %s)",
        cfg.model_path,
        cfg.host,
        cfg.port,
        _http_stack(),
        cfg.switch_interval_us,
        "in a process of its own" if front_end is not None else "in this process",
    )
    try:
        serve_until_stopped(
            app,
            shutdown_timeout_s=cfg.shutdown_timeout_s,
            log_level=cfg.log_level,
            access_log=False,
            # a long keep-alive: clients reuse connections between generation bursts (see the client transport)
            timeout_keep_alive=75,
            **uvicorn_bind,
        )
        if front_end is not None and front_end.failure is not None:
            raise InferenceError(f"areal serve did not start: {front_end.failure}")
    finally:
        sys.setswitchinterval(saved_interval)
        uninstall()  # the spans still buffered go to the part file
