"""The SGLang native protocol (checked field for field against sglang 0.5.23, see docs/inference.md).

``POST /generate`` takes ``{"rid", "input_ids", "sampling_params", "return_logprob": true,
"stream": false}`` (plus ``image_data``, the prompt's images, when it has any) and answers
``{"text", "output_ids", "meta_info": {"id", "finish_reason":
{"type": "stop"|"length"|"abort", ...}, "prompt_tokens", "completion_tokens",
"output_token_logprobs": [[logprob, token_id, text|null], ...], "weight_version",
"weight_versions": [{"version", "start", "end"}], ...}}``. Control endpoints:
``/abort_request`` (``{"rid", "abort_all"}``: stops every request whose rid *starts with* ``rid``),
``/pause_generation`` (``mode``), ``/continue_generation``, ``/update_weights_from_disk``,
``/init_weights_update_group`` (left with ``/destroy_weights_update_group``), then per update
``/begin_weight_update``, one ``/update_weights_from_distributed`` per bucket and
``/end_weight_update`` (0.5.23 refuses a distributed update outside that session),
``/get_model_info``, ``/health``.

Policy versions: the client sends ``weight_version=str(meta.version)`` with every weight update,
so the server reports the version of the weights that produced each token (``weight_versions``
spans, else ``weight_version``); tokens it reports no integer version for are tagged by the core.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from areal_tasks.api.inference import ParamSpec, PauseMode, SamplingParams
from areal_tasks.errors import InferenceError, InferenceRequestError
from areal_tasks.inference.client.protocol import GenerateInput, GenerateOutput, HttpCall, ProtocolAdapter, described

if TYPE_CHECKING:
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = ["SGLangAdapter", "sglang_sampling_params"]

_STOP_TYPES = ("stop", "length", "abort")


def sglang_sampling_params(sampling: SamplingParams) -> dict[str, Any]:
    """SGLang ``sampling_params`` (unknown keys are rejected there, so only its own names)."""
    params: dict[str, Any] = {
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "ignore_eos": sampling.ignore_eos,
    }
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        params["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return params


def _as_version(value: Any) -> int | None:
    """An integer policy version from SGLang's string ``weight_version`` (``"default"`` -> None)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _token_versions(meta: dict[str, Any], n: int) -> list[int | None] | None:
    spans = meta.get("weight_versions")
    if spans:
        versions: list[int | None] = [None] * n
        for span in spans:
            version = _as_version(span.get("version"))
            for i in range(max(0, int(span.get("start", 0))), min(n, int(span.get("end", 0)))):
                versions[i] = version
        return versions
    version = _as_version(meta.get("weight_version"))
    return None if version is None else [version] * n


class SGLangAdapter(ProtocolAdapter):
    """Speaks SGLang's native HTTP protocol."""

    name = "sglang"

    def generate(self, inp: GenerateInput) -> HttpCall:
        body = {
            "rid": inp.rid,
            "input_ids": list(inp.input_ids),
            "sampling_params": sglang_sampling_params(inp.sampling),
            "return_logprob": True,
            "stream": False,
        }
        if inp.image_data:
            body["image_data"] = list(inp.image_data)
        return HttpCall("POST", "/generate", json=body)

    def parse_generate(self, payload: Any, inp: GenerateInput) -> GenerateOutput:
        if not isinstance(payload, dict) or not isinstance(payload.get("meta_info"), dict):
            raise InferenceRequestError(f"request {inp.rid}: /generate answer has no meta_info: {str(payload)[:300]}")
        meta = payload["meta_info"]
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind not in _STOP_TYPES:
            raise InferenceRequestError(f"request {inp.rid}: unknown finish_reason {finish!r}")
        entries = meta.get("output_token_logprobs") or []
        output_ids = payload.get("output_ids")
        if output_ids is None:
            output_ids = [int(e[1]) for e in entries]
        output_ids = [int(t) for t in output_ids]
        if len(entries) != len(output_ids) or any(int(e[1]) != t for e, t in zip(entries, output_ids)):
            raise InferenceRequestError(
                f"request {inp.rid}: output_token_logprobs ({len(entries)} entries) do not match "
                f"output_ids ({len(output_ids)} tokens)"
            )
        if any(e[0] is None for e in entries):
            raise InferenceRequestError(f"request {inp.rid}: an output token has no logprob")
        error = None
        status = finish.get("status_code")
        if kind == "abort" and isinstance(status, int) and status >= 400:
            error = f"HTTP {status} {finish.get('err_type') or ''}: {finish.get('message')}".strip()
        latency = meta.get("first_token_latency")
        return GenerateOutput(
            output_ids=output_ids,
            output_logprobs=[float(e[0]) for e in entries],
            stop_reason=kind,
            versions=_token_versions(meta, len(output_ids)),
            error=error,
            first_token_latency_s=float(latency) if isinstance(latency, (int, float)) else None,
        )

    def abort(self, rid: str) -> HttpCall | None:
        """``/abort_request`` for ``rid``. SGLang does not stop a non-streaming request when its
        client disconnects, so an abandoned attempt needs this call. SGLang matches by prefix (which
        also stops the ``<rid>_<j>`` samples of an ``n > 1`` request); an empty rid would match
        every request, so it is refused here."""
        if not isinstance(rid, str) or not rid:
            raise InferenceError(
                f"abort: rid must be a non-empty string (an empty one aborts every request), got {rid!r}"
            )
        return HttpCall("POST", "/abort_request", json={"rid": rid, "abort_all": False})

    def health(self) -> HttpCall:
        return HttpCall("GET", "/health")

    def model_info(self) -> HttpCall:
        return HttpCall("GET", "/get_model_info")

    def parse_version(self, payload: Any) -> int | None:
        return _as_version(payload.get("weight_version")) if isinstance(payload, dict) else None

    def pause(self, mode: PauseMode) -> HttpCall:
        return HttpCall("POST", "/pause_generation", json={"mode": mode})

    def resume(self) -> HttpCall:
        return HttpCall("POST", "/continue_generation", json={})

    def update_weights_from_disk(self, meta: WeightUpdateMeta, *, flush_cache: bool = True) -> HttpCall:
        body = {
            "model_path": meta.path,
            "abort_all_requests": False,
            "weight_version": str(meta.version),
            "flush_cache": flush_cache,
        }
        return HttpCall("POST", "/update_weights_from_disk", json=body)

    def init_weight_group(self, meta: WeightUpdateMeta, rank_offset: int) -> HttpCall:
        body = {
            "master_address": meta.master_addr,
            "master_port": meta.master_port,
            "rank_offset": rank_offset,
            "world_size": meta.world_size,
            "group_name": meta.group_name,
            "backend": meta.backend,
        }
        return HttpCall("POST", "/init_weights_update_group", json=body)

    def destroy_weight_group(self, group_name: str) -> HttpCall | None:
        return HttpCall("POST", "/destroy_weights_update_group", json={"group_name": group_name})

    def update_weights_from_distributed(
        self, meta: WeightUpdateMeta, bucket: Sequence[ParamSpec], *, flush_cache: bool = True
    ) -> HttpCall:
        body = {
            **described(bucket),
            "group_name": meta.group_name,
            "load_format": "flattened_bucket",
            "flush_cache": flush_cache,
            "abort_all_requests": False,
            "weight_version": str(meta.version),
        }
        return HttpCall("POST", "/update_weights_from_distributed", json=body)

    def begin_weight_update(self, meta: WeightUpdateMeta) -> HttpCall | None:
        # 0.5.23 refuses /update_weights_from_distributed outside a begin/end session; a disk
        # update needs none (and its end would post-process the loaded weights a second time)
        return HttpCall("POST", "/begin_weight_update", json={}) if meta.type == "collective" else None

    def end_weight_update(self, meta: WeightUpdateMeta) -> HttpCall | None:
        return HttpCall("POST", "/end_weight_update", json={}) if meta.type == "collective" else None
