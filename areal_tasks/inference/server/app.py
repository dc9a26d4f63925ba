"""HTTP routes of the embedded server: SGLang's native API (status codes and bodies as SGLang 0.5.23).

``/generate`` answers one object for one prompt, a list for a batch or ``n > 1`` (prompt-major);
a request that fails inside the engine answers with the abort's status code. A JSON body that
validates skips FastAPI's request handling (``generate_route.py``); everything else takes the
FastAPI route below. Admin routes answer
``{"success", "message"}`` with 200 or 400 like SGLang; ``/pause_generation`` and
``/continue_generation`` answer ``{"message", "status": "ok"}``. OpenAI routes live in
``openai_routes.py``; ``/metrics`` and API-key checks in ``metrics.py`` and ``auth.py``.

Refusals: a body, prompt or request past the server's limits answers 413, a full queue 429 with
``Retry-After`` (``limits.py``, ``body_limit.py``); a body of the wrong shape or types 400 naming
the field (bodies are strict: nothing is converted). A generation whose client disconnects is
aborted. ``/health`` answers 503 with the reason while the server cannot serve
(``EmbeddedServer.health_problem``), never for a pause.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import sys
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from areal_tasks.errors import InferenceError, InferenceLimitError, InferenceRequestError
from areal_tasks.inference.admin_paths import SHARED_WEIGHTS_PATH, SWAP_WEIGHTS_PATH
from areal_tasks.inference.server.body_limit import BodyLimitMiddleware, BodyTooLargeError
from areal_tasks.inference.server.disconnect import while_connected
from areal_tasks.inference.server.generate_route import GENERATE_PATH, install_generate_route
from areal_tasks.inference.server.json_answer import JsonAnswer
from areal_tasks.inference.server.limits import check_prompt_chars, check_request_size
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
from areal_tasks.trace import span

logger = logging.getLogger(__name__)

#: validation problems quoted in a 400 at most.
_MAX_PROBLEMS = 5


def _result(success: bool, message: str, **extra: Any) -> JSONResponse:
    status = HTTPStatus.OK if success else HTTPStatus.BAD_REQUEST
    return JSONResponse({"success": success, "message": message, **extra}, status_code=status)


#: FastAPI's detail for a body that is not JSON text at all (invalid UTF-8, say).
_FASTAPI_UNPARSABLE = "There was an error parsing the body"


def _error(
    message: str,
    status: int = HTTPStatus.BAD_REQUEST,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape (``message``, ``type``, ``param``, ``code``), which SGLang's
    clients read too (they take ``error.message``)."""
    kind = "invalid_request_error" if status < HTTPStatus.INTERNAL_SERVER_ERROR else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def _error_param(errors: list[Any]) -> str | None:
    """The field of the first pydantic problem (OpenAI's ``param``), dotted, or None."""
    for error in errors[:1]:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        return ".".join(loc) or None
    return None


def validation_message(errors: list[Any]) -> str:
    """A 400's message for pydantic ``errors``: each problem's field path and what is wrong, never
    the value (a body may be megabytes)."""
    problems = []
    for error in errors[:_MAX_PROBLEMS]:
        loc = [str(part) for part in error.get("loc", ()) if part != "body"]
        problems.append(f"{'.'.join(loc) or 'body'}: {error.get('msg', 'invalid')}")
    more = f" (and {len(errors) - _MAX_PROBLEMS} more)" if len(errors) > _MAX_PROBLEMS else ""
    return "invalid request body: " + "; ".join(problems) + more


def create_app(server: EmbeddedServer) -> FastAPI:
    """The FastAPI application serving ``server`` (API keys are added around it by
    :func:`~areal_tasks.inference.server.auth.install_api_keys`)."""
    app = FastAPI(title="areal embedded inference server")
    app.state.server = server
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=server.limits.max_body_bytes)
    app.include_router(openai_router())

    @app.exception_handler(InferenceLimitError)
    async def over_limit(_: Request, exc: InferenceLimitError) -> JSONResponse:
        retry = exc.retry_after_s
        headers = None if retry is None else {"Retry-After": str(max(1, math.ceil(retry)))}
        return _error(str(exc), exc.status_code, headers, exc.param)

    @app.exception_handler(InferenceRequestError)
    async def bad_request(_: Request, exc: InferenceRequestError) -> JSONResponse:
        return _error(str(exc), param=exc.param)

    @app.exception_handler(InferenceError)
    async def unavailable(request: Request, exc: InferenceError) -> JSONResponse:
        # the server's own state (shutting down, engine stopped), not the request: try another server
        logger.warning("%s %s answered 503: %s", request.method, request.url.path, exc, exc_info=exc)
        return _error(str(exc), HTTPStatus.SERVICE_UNAVAILABLE)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        return _error(validation_message(errors), param=_error_param(errors))

    @app.exception_handler(BodyTooLargeError)
    async def body_too_large(_: Request, exc: BodyTooLargeError) -> JSONResponse:
        return _error(exc.detail, HTTPStatus.REQUEST_ENTITY_TOO_LARGE)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # the framework's own refusals (an unknown path, a wrong method, a body that is not text)
        # in the same error shape as every other answer
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == HTTPStatus.BAD_REQUEST and message == _FASTAPI_UNPARSABLE:
            message = "the request body could not be parsed: send a JSON object encoded as UTF-8"
        return _error(message, exc.status_code, exc.headers)

    @app.get("/health")
    @app.get("/health_generate")
    @app.get("/ready")
    async def health() -> Response:
        problem = server.health_problem()
        if problem is not None:
            return _error(problem, HTTPStatus.SERVICE_UNAVAILABLE)
        return Response(status_code=200)

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
            "prefix_cache": server.engine.prefix_cache is not None,
            "image_cache": None
            if server.runner.vision is None
            else dataclasses.asdict(server.runner.vision.images.stats()),
            "paused": stats.paused,
            "weight_update_groups": server.weights.groups,
            "request_limits": dataclasses.asdict(server.limits),
            # objects of the start-up heap kept out of the garbage collector's sight (areal_tasks/gc_heap.py)
            "gc_frozen_objects": gc.get_freeze_count(),
            # where HTTP runs (server.py's HTTP_FRONTENDS; run_server sets it)
            "http_frontend": getattr(app.state, "http_frontend", "inline"),
            # the interpreter's switch interval (server.py, DEFAULT_SWITCH_INTERVAL_US)
            "switch_interval_us": round(sys.getswitchinterval() * 1e6, 3),
            "version": "areal-embedded",
        }

    async def split(req: GenerateReqInput) -> tuple[list[dict[str, Any]], bool]:
        """``split_generate``, with text measured first and tokenised on the tokenize lane, then the
        images made ready (``EmbeddedServer.prepare_images``)."""
        if req.text is None:
            items, is_batch = split_generate(req, server.tokenizer.encode)
        else:
            texts = [req.text] if isinstance(req.text, str) else req.text
            check_request_size(server.limits, [1] * len(texts))
            check_prompt_chars(server.limits, texts)
            items, is_batch = await server.off_loop(
                split_generate, req, server.tokenizer.encode, what="tokenizing the prompt"
            )
        await server.prepare_images(items)
        return items, is_batch

    @app.api_route(GENERATE_PATH, methods=["POST", "PUT"])
    async def generate(req: GenerateReqInput, request: Request) -> Response:
        return await while_connected(request, _generate(req))

    async def _generate(req: GenerateReqInput) -> Response:
        with span("/generate", "server", concurrent=True, rid=req.rid):
            return await _generate_traced(req)

    async def _generate_traced(req: GenerateReqInput) -> Response:
        items, is_batch = await split(req)
        seqs = await server.generate_sequences(items)
        failed = [s for s in seqs if (s.finish_reason or {}).get("status_code")]
        if failed:
            reason = failed[0].finish_reason
            return _error(reason["message"], reason["status_code"])
        outputs = [server.response(s, req.return_text_in_logprobs) for s in seqs]
        return JsonAnswer(outputs if is_batch or len(outputs) > 1 else outputs[0])

    # the same answer, without FastAPI's request handling, for JSON bodies that validate
    install_generate_route(app, _generate)

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
        images = None if server.runner.vision is None else server.runner.vision.images.stats()
        return Response(
            render_metrics(server.engine.stats(), server.served_model_name, images), media_type=CONTENT_TYPE
        )

    return app
