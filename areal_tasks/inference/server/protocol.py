"""Wire types of the SGLang native endpoints, field for field as SGLang 0.5.23 defines them.

Request bodies follow ``sglang/srt/managers/io_struct.py`` (and the ``sglang.api.v1`` JSON
contract): unknown top-level keys of ``/generate`` are ignored like SGLang does, unknown
``sampling_params`` keys are rejected, and fields this server cannot honour (video, audio, LoRA,
``token_ids_logprob``, hidden states, grammars...) are refused when set instead of silently ignored.
``image_data`` (SGLang's) gives a prompt's images: for one prompt a string or a list of strings,
for a batch one entry (a string, a list of strings or null) per prompt; each string base64 image
bytes or a ``data:image/...;base64`` URL (``images.py``, ``vision.py``).
Bodies are strict: values must have their JSON type already (a string is not a number, ``true`` is
not a token id, an integer is accepted for a float); a wrong one is a 400 naming the field, never
converted and never a 500.
:func:`generate_response` builds SGLang's ``/generate`` answer: ``text``, ``output_ids`` and
``meta_info`` (``id``, ``finish_reason``, ``prompt_tokens``, ``completion_tokens``,
``cached_tokens``, ``weight_version``, ``e2e_latency``; with ``return_logprob`` the
``output_token_logprobs`` as ``[[logprob, token_id, null], ...]``; with ``return_logprob`` and
``top_logprobs_num`` k > 0 also SGLang's ``output_top_logprobs`` (per output token, its k most
likely tokens as ``[logprob, token_id, text-or-null]``, most likely first) and
``input_top_logprobs`` (the same for the prompt positions from ``logprob_start_len``; the first
prompt position's entry is null). ``top_logprobs_num`` is bounded by
:data:`~areal_tasks.inference.server.limits.MAX_TOP_LOGPROBS` (SGLang sets no bound: the
answer grows with it); above it, or negative, is a 400 naming it.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.server.limits import MAX_TOP_LOGPROBS
from areal_tasks.inference.server.request import Sequence
from areal_tasks.inference.server.top_logprobs import TopEntry

logger = logging.getLogger(__name__)

#: /generate fields SGLang has that this server does not implement: refused unless unset/default.
_REFUSED_GENERATE_FIELDS: dict[str, Any] = {
    "input_embeds": None,
    "video_data": None,
    "audio_data": None,
    "token_ids_logprob": None,
    "return_hidden_states": False,
    "lora_path": None,
    "session_params": None,
    "custom_logit_processor": None,
    "return_sampling_mask": None,
}


class _Body(BaseModel):
    """SGLang request bodies ignore keys they do not know (msgspec ``kw_only`` structs with defaults);
    the values of the keys they know are strictly typed (see the module doc)."""

    model_config = ConfigDict(extra="ignore", strict=True)


class GenerateReqInput(_Body):
    """``/generate`` (``GenerateReqInput``): one prompt, or a batch when ``text``/``input_ids`` is a list of them."""

    model_config = ConfigDict(extra="allow")

    rid: str | list[str] | None = None
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    image_data: str | list[str | list[str] | None] | None = None

    def refused_fields(self) -> list[str]:
        extra = self.model_extra
        if not extra:  # the usual body: no field beyond the model's (a scan of the refused ones a call, before)
            return []
        return sorted(
            k
            for k in extra.keys() & _REFUSED_GENERATE_FIELDS.keys()
            if extra[k] not in (None, _REFUSED_GENERATE_FIELDS[k])
        )


class UpdateWeightFromDiskReqInput(_Body):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    is_async: bool = False
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    token_step: int = 0
    flush_cache: bool = True
    manifest: dict[str, Any] | None = None


class InitWeightsUpdateGroupReqInput(_Body):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class DestroyWeightsUpdateGroupReqInput(_Body):
    group_name: str = "weight_update_group"


class UpdateWeightsFromDistributedReqInput(_Body):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    selector: Literal["target", "draft", "all"] = "all"
    torch_empty_cache: bool = False


class BeginWeightUpdateReqInput(_Body):
    selector: Literal["target", "draft", "all"] = "all"


class EndWeightUpdateReqInput(_Body):
    pass


class UpdateWeightVersionReqInput(_Body):
    new_version: str
    abort_all_requests: bool = True


class PauseGenerationReqInput(_Body):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueGenerationReqInput(_Body):
    torch_empty_cache: bool = True


class UpdateWeightsFromSharedReqInput(_Body):
    """``/areal/update_weights_from_shared`` (this server's extension): copy the weights from the
    trainer's shared buffer on this server's device; ``names``, ``dtypes`` and ``shapes`` list the
    tensors back to back in it (``areal_tasks/weights/shared.py``)."""

    shared_buffers: list[dict[str, Any]]
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    weight_version: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False


class SwapWeightsReqInput(_Body):
    """``/areal/swap_weights`` (this server's extension, not SGLang's): pause in ``mode``, load one
    update (``model_path`` for a disk one; ``shared_buffers`` for a shared one; else one
    ``flattened_bucket`` broadcast on ``group_name``; both described by ``names``, ``dtypes`` and
    ``shapes``), resume."""

    mode: Literal["abort", "retract", "in_place"] = "abort"
    weight_version: str | None = None
    flush_cache: bool = True
    model_path: str | None = None
    group_name: str = "weight_update_group"
    shared_buffers: list[dict[str, Any]] = []
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[list[int]] = []


class AbortReqInput(_Body):
    rid: str = ""
    abort_all: bool = False


def _per_item(value: Any, count: int, name: str) -> list[Any]:
    """SGLang's batch rule: a list gives one value per prompt, a scalar applies to all."""
    if isinstance(value, list) and not (name == "sampling_params" and not value):
        if len(value) != count:
            raise InferenceRequestError(f"{name}: {len(value)} values for {count} prompts")
        return list(value)
    return [value] * count


def split_images(image_data: Any, count: int, is_batch: bool) -> list[list[str]]:
    """Each prompt's images (see the module doc for the shapes ``image_data`` takes)."""
    if image_data is None:
        return [[] for _ in range(count)]
    if not is_batch:
        images = [image_data] if isinstance(image_data, str) else image_data
        if not all(isinstance(image, str) for image in images):
            raise InferenceRequestError(
                "image_data: for one prompt, give a string or a list of strings", param="image_data"
            )
        return [list(images)]
    if not isinstance(image_data, list) or len(image_data) != count:
        got = len(image_data) if isinstance(image_data, list) else "a string"
        raise InferenceRequestError(
            f"image_data: a batch of {count} prompts needs a list of {count} entries (one per prompt), got {got}",
            param="image_data",
        )
    return [[] if entry is None else [entry] if isinstance(entry, str) else list(entry) for entry in image_data]


def split_generate(req: GenerateReqInput, tokenize: Any) -> tuple[list[dict[str, Any]], bool]:
    """One dict per prompt (``input_ids``, ``sampling_params``, ``rid``, ``return_logprob``,
    ``logprob_start_len``, ``top_logprobs_num``; with images ``image_data``, and ``image_field``
    that names them in errors) and whether the request was a batch."""
    refused = req.refused_fields()
    if refused:
        raise InferenceRequestError(f"/generate: {refused} are not supported by the embedded server")
    if req.stream:
        raise InferenceRequestError("/generate: stream=true is not supported by the embedded server")
    if (req.text is None) == (req.input_ids is None):
        raise InferenceRequestError("/generate: give exactly one of text or input_ids")
    if req.text is not None:
        is_batch = isinstance(req.text, list)
        prompts = [tokenize(t) for t in (req.text if is_batch else [req.text])]
    else:
        ids = req.input_ids
        is_batch = bool(ids) and isinstance(ids[0], list)
        prompts = list(ids) if is_batch else [ids]
    count = len(prompts)
    if count == 0:
        raise InferenceRequestError("/generate: the batch is empty")
    top = _per_item(req.top_logprobs_num, count, "top_logprobs_num")
    wrong = [t for t in top if t is not None and not 0 <= t <= MAX_TOP_LOGPROBS]
    if wrong:
        raise InferenceRequestError(
            f"/generate: top_logprobs_num must be in 0..{MAX_TOP_LOGPROBS}, got {wrong[0]}", param="top_logprobs_num"
        )
    rids = (
        _per_item(req.rid, count, "rid")
        if isinstance(req.rid, list) or req.rid is None or count == 1
        else [f"{req.rid}_{i}" for i in range(count)]
    )
    params = _per_item(req.sampling_params, count, "sampling_params")
    logprob = _per_item(req.return_logprob, count, "return_logprob")
    start = _per_item(req.logprob_start_len, count, "logprob_start_len")
    images = split_images(req.image_data, count, is_batch)
    items = [
        {
            "input_ids": prompts[i],
            "sampling_params": params[i] or {},
            "rid": rids[i],
            "return_logprob": bool(logprob[i]),  # None: False
            "logprob_start_len": -1 if start[i] is None else start[i],
            "top_logprobs_num": top[i] or 0,
        }
        for i in range(count)
    ]
    for i, item in enumerate(items):
        if images[i]:
            item["image_data"], item["image_field"] = images[i], f"image_data[{i}]" if is_batch else "image_data"
    return items, is_batch


def _logprob_entries(values: list[float | None], ids: list[int], texts: list[str] | None) -> list[list[Any]]:
    return [[v, t, None if texts is None else texts[i]] for i, (v, t) in enumerate(zip(values, ids))]


def _top_entries(tops: list[TopEntry | None], decode: Any | None) -> list[list[list[Any]] | None]:
    """SGLang's ``*_top_logprobs``: per position, ``[[logprob, token_id, text-or-null], ...]`` (or null)."""
    return [None if top is None else [[v, t, None if decode is None else decode(t)] for t, v in top] for top in tops]


def weight_version_spans(seq: Sequence, current: str) -> list[dict[str, Any]]:
    """SGLang's ``weight_versions``: which weight version produced which output tokens."""
    changes = [*seq.version_events, (current, len(seq.output_ids))]
    spans: list[dict[str, Any]] = []
    for version, change_end in changes:
        end = min(change_end, len(seq.output_ids))
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return spans


def generate_response(seq: Sequence, text: str, decode_token: Any | None = None) -> dict[str, Any]:
    """SGLang's ``/generate`` answer for one finished sequence (see the module doc); the version is
    the one the engine held when the sequence finished."""
    weight_version = seq.finish_version or ""
    end = seq.finished_at if seq.finished_at is not None else seq.created_at
    meta: dict[str, Any] = {
        "id": seq.rid,
        "finish_reason": seq.finish_reason,
        "prompt_tokens": len(seq.prompt_ids),
        "weight_version": weight_version,
        "num_retractions": seq.num_retractions,
        "reasoning_tokens": 0,
        "completion_tokens": len(seq.output_ids),
        "cached_tokens": seq.cached_tokens,
        "e2e_latency": end - seq.created_at,
    }
    if seq.version_events:
        meta["weight_versions"] = weight_version_spans(seq, weight_version)
    if seq.return_logprob:
        out_texts = [decode_token(t) for t in seq.output_ids] if decode_token else None
        in_ids = seq.prompt_ids[max(seq.logprob_start_len, 0) :] if seq.logprob_start_len >= 0 else []
        in_values = seq.group.input_logprobs if seq.logprob_start_len >= 0 else []
        in_texts = [decode_token(t) for t in in_ids] if decode_token else None
        meta["input_token_logprobs"] = _logprob_entries(in_values, in_ids, in_texts)
        meta["output_token_logprobs"] = _logprob_entries(seq.output_logprobs, seq.output_ids, out_texts)
        meta["output_token_logprobs_length"] = len(seq.output_ids)
        if seq.top_logprobs_num > 0:
            in_tops = seq.group.input_top_logprobs if seq.logprob_start_len >= 0 else []
            meta["input_top_logprobs"] = _top_entries(list(in_tops), decode_token)
            meta["output_top_logprobs"] = _top_entries(list(seq.output_top_logprobs), decode_token)
    return {"text": text, "output_ids": list(seq.output_ids), "meta_info": meta}
