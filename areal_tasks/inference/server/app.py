"""HTTP routes of the embedded server: SGLang's native API (status codes and bodies as SGLang 0.5.23).

``/generate`` answers one object for one prompt, a list for a batch or ``n > 1`` (prompt-major);
a request that fails inside the engine answers with the abort's status code. Admin routes answer
``{"success", "message"}`` with 200 or 400 like SGLang; ``/pause_generation`` and
``/continue_generation`` answer ``{"message", "status": "ok"}``. OpenAI routes live in
``openai_routes.py``; ``/metrics`` and API-key checks in ``metrics.py`` and ``auth.py``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.admin_paths import SHARED_WEIGHTS_PATH, SWAP_WEIGHTS_PATH
from areal_tasks.inference.server.auth import ApiKeyMiddleware
from areal_tasks.inference.server.metrics import CONTENT_TYPE, render_metrics
from areal_tasks.inference.server.openai_routes import openai_router
from areal_tasks.inference.server.protocol import (
    AbortReqInput,
    BeginWeightUpdateReqInput,
    ContinueGenerationReqInput,
    DestroyWeightsUpdateGroupReqInput,
    EndWeightUpdateReqInput,
    GenerateReqInput,
    InitWeightsUpdateGroupReqInput,
    PauseGenerationReqInput,
    SwapWeightsReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromSharedReqInput,
    UpdateWeightVersionReqInput,
    split_generate,
)
from areal_tasks.inference.server.service import EmbeddedServer

logger = logging.getLogger(__name__)


def _result(success: bool, message: str, **extra: Any) -> JSONResponse:
    status = HTTPStatus.OK if success else HTTPStatus.BAD_REQUEST
    return JSONResponse({"success": success, "message": message, **extra}, status_code=status)


def _error(message: str, status: int = HTTPStatus.BAD_REQUEST) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def create_app(server: EmbeddedServer, api_key: str | None = None, admin_api_key: str | None = None) -> FastAPI:
    """The FastAPI application serving ``server``."""
    app = FastAPI(title="areal embedded inference server")
    app.state.server = server
    if api_key or admin_api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, admin_api_key=admin_api_key)
    app.include_router(openai_router())

    @app.exception_handler(InferenceRequestError)
    async def bad_request(_: Request, exc: InferenceRequestError) -> JSONResponse:
        return _error(str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(f"invalid request body: {exc.errors()}")

    @app.get("/health")
    @app.get("/health_generate")
    @app.get("/ready")
    async def health() -> Response:
        return Response(status_code=200 if server.engine.alive else 503)

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        return server.model_info()

    @app.get("/get_server_info")
    @app.get("/server_info")
    async def server_info() -> dict[str, Any]:
        stats = server.engine.stats()
        return {
            **server.model_info(),
            "max_context_length": server.runner.max_len,
            "max_running_requests": server.runner.cache.num_slots,
            "max_total_num_tokens": server.runner.cache.capacity_tokens,
            "device": str(server.runner.device),
            "dtype": str(server.runner.dtype).removeprefix("torch."),
            "cuda_graphs": bool(getattr(server.runner, "capture", False)),
            "torch_compile": bool(server.runner.compiled),
            "torch_compile_scope": getattr(server.runner, "compile_scope", None),
            "decode_attention": server.runner.decode_attention,
            "overlap_schedule": server.engine.overlap,
            "paused": stats.paused,
            "weight_update_groups": server.weights.groups,
            "version": "areal-embedded",
        }

    @app.api_route("/generate", methods=["POST", "PUT"])
    async def generate(req: GenerateReqInput) -> Response:
        items, is_batch = split_generate(req, server.tokenizer.encode)
        seqs = await server.generate_sequences(items)
        failed = [s for s in seqs if (s.finish_reason or {}).get("status_code")]
        if failed:
            reason = failed[0].finish_reason
            return _error(reason["message"], reason["status_code"])
        outputs = [server.response(s, req.return_text_in_logprobs) for s in seqs]
        return JSONResponse(outputs if is_batch or len(outputs) > 1 else outputs[0])

    @app.post("/abort_request")
    async def abort_request(req: AbortReqInput) -> Response:
        await server.abort(req.rid, req.abort_all)
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        success, message = await server.flush_cache()
        return PlainTextResponse(message + "\n", status_code=200 if success else HTTPStatus.BAD_REQUEST)

    @app.post("/pause_generation")
    async def pause_generation(req: PauseGenerationReqInput) -> JSONResponse:
        await server.pause(req.mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation(req: ContinueGenerationReqInput) -> JSONResponse:
        await server.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    weights = server.weights

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(req: UpdateWeightFromDiskReqInput) -> JSONResponse:
        success, message = await weights.update_from_disk(
            req.model_path, req.weight_version, req.abort_all_requests, req.load_format, req.flush_cache
        )
        if success:
            server.model_path = req.model_path
        return _result(success, message, num_paused_requests=0)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(req: InitWeightsUpdateGroupReqInput) -> JSONResponse:
        return _result(
            *await weights.init_group(
                req.master_address, req.master_port, req.rank_offset, req.world_size, req.group_name, req.backend
            )
        )

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(req: DestroyWeightsUpdateGroupReqInput) -> JSONResponse:
        return _result(*await weights.destroy_group(req.group_name))

    @app.post("/begin_weight_update")
    async def begin_weight_update(req: BeginWeightUpdateReqInput) -> JSONResponse:
        return _result(*weights.begin())

    @app.post("/end_weight_update")
    async def end_weight_update(req: EndWeightUpdateReqInput) -> JSONResponse:
        return _result(*await weights.end())

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(req: UpdateWeightsFromDistributedReqInput) -> JSONResponse:
        return _result(
            *await weights.update_from_distributed(
                req.names,
                req.dtypes,
                req.shapes,
                req.group_name,
                req.weight_version,
                req.abort_all_requests,
                req.load_format,
                req.flush_cache,
            )
        )

    @app.post(SWAP_WEIGHTS_PATH)
    async def swap_weights(req: SwapWeightsReqInput) -> JSONResponse:
        success, message, timings = await weights.swap(req)
        if success and req.model_path is not None:
            server.model_path = req.model_path
        return _result(success, message, timings=timings)

    @app.post(SHARED_WEIGHTS_PATH)
    async def update_weights_from_shared(req: UpdateWeightsFromSharedReqInput) -> JSONResponse:
        return _result(
            *await weights.update_from_shared(
                req.shared_buffers,
                req.names,
                req.dtypes,
                req.shapes,
                req.weight_version,
                req.abort_all_requests,
                req.flush_cache,
            )
        )

    @app.post("/update_weight_version")
    async def update_weight_version(req: UpdateWeightVersionReqInput) -> JSONResponse:
        await weights.set_version(req.new_version, req.abort_all_requests)
        return JSONResponse(
            {"success": True, "message": f"Weight version updated to {req.new_version}", "new_version": req.new_version}
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(server.engine.stats(), server.served_model_name), media_type=CONTENT_TYPE)

    return app
