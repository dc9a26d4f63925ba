"""The backend adapter interface: what one inference backend must say about its HTTP protocol.

The shared client core (:mod:`.core`) owns every piece of client behaviour: load balancing, retries
with backoff, timeouts, the concurrency cap, partial rollout and version tagging, fan-out of control
calls. A backend is a :class:`ProtocolAdapter`: a pure translator, with no I/O and no state of
its own, that

* turns a :class:`GenerateInput` into the :class:`HttpCall` of one generate request, and the
  decoded JSON answer into a :class:`GenerateOutput` (tokens, logprobs, stop reason, versions);
* names the calls (and their bodies) of health, pause, resume, weight update from disk, joining and
  leaving the collective weight-update group, receiving one broadcast bucket, and the
  model-info/version query;
* names the call that stops one generate attempt the client gave up on
  (:meth:`ProtocolAdapter.abort`), or says that closing its connection already does;
* judges the answer of a control call (:meth:`ProtocolAdapter.control_error`).

Adapters: ``sglang`` (:mod:`.sglang`), ``embedded`` (:mod:`.embedded`; speaks SGLang's protocol)
and ``vllm`` (:mod:`.vllm`). They are looked up by name in :mod:`areal_tasks.inference.registry`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from areal_tasks.api.inference import ParamSpec, PauseMode, SamplingParams, StopReason

if TYPE_CHECKING:
    from areal_tasks.api.weight_update import WeightUpdateMeta

logger = logging.getLogger(__name__)

__all__ = ["GenerateInput", "GenerateOutput", "HttpCall", "ProtocolAdapter", "described"]


@dataclass(frozen=True)
class HttpCall:
    """One HTTP request, relative to a server's base URL (``http://host:port``)."""

    method: Literal["GET", "POST"]
    path: str
    #: JSON body (POST) or None.
    json: dict[str, Any] | None = None
    #: query parameters or None.
    params: dict[str, Any] | None = None


@dataclass(frozen=True)
class GenerateInput:
    """One attempt of a generation, as the core hands it to an adapter.

    For a resubmitted partial rollout ``input_ids`` is the prompt plus the tokens generated so far
    and ``sampling.max_new_tokens`` the budget left.
    """

    #: id of this attempt (``<request rid>-<n>``; unique, never a prefix of another attempt's).
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    #: the prompt's images (``ModelRequest.image_data``): base64 or ``data:image/...;base64`` URLs, in
    #: the order of their placeholders in ``input_ids``; every attempt sends them again.
    image_data: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerateOutput:
    """The parsed answer of one generate attempt."""

    output_ids: list[int]
    output_logprobs: list[float]
    #: ``abort`` when the server stopped the request early (a pause, or an error: see ``error``).
    stop_reason: StopReason
    #: policy version of every output token as the server reports it; None entries (or None as a
    #: whole) mean "not reported": the core tags those with the version current at submission.
    versions: list[int | None] | None = None
    #: for an abort: the server's error message when the abort was an error (not resubmitted).
    error: str | None = None
    #: server-measured seconds from arrival to the first output token, when reported.
    first_token_latency_s: float | None = None


def described(specs: Sequence[ParamSpec]) -> dict[str, list]:
    """``names``, ``dtypes`` and ``shapes`` of ``specs``, in order: how SGLang's protocol (and the
    embedded server's extensions) describe tensors lying back to back in one flat buffer."""
    return {
        "names": [p.name for p in specs],
        "dtypes": [p.dtype for p in specs],
        "shapes": [list(p.shape) for p in specs],
    }


class ProtocolAdapter(ABC):
    """How to speak one backend's HTTP protocol (pure: builds calls and parses answers)."""

    #: backend name (``sglang``, ``embedded``, ``vllm``).
    name: ClassVar[str]

    # -- generation --------------------------------------------------------------------------

    @abstractmethod
    def generate(self, inp: GenerateInput) -> HttpCall:
        """The non-streaming generate request of ``inp`` (with per-token logprobs)."""

    @abstractmethod
    def parse_generate(self, payload: Any, inp: GenerateInput) -> GenerateOutput:
        """Decode a 200 answer of :meth:`generate`; raise InferenceRequestError if it is malformed."""

    @abstractmethod
    def abort(self, rid: str) -> HttpCall | None:
        """The call that stops the generate attempt ``rid`` (a :attr:`GenerateInput.rid`) on the
        server it was sent to, or None when the server stops it by itself once the client closes
        the attempt's connection.

        The core sends it, best effort, when it abandons an attempt (its timeout fired, the caller
        cancelled it, or it is retried elsewhere), never for a partial rollout that the server cut
        short with ``abort`` (the server already stopped that one). Aborting an attempt that
        already finished must be harmless."""

    # -- health and identity -------------------------------------------------------------------

    @abstractmethod
    def health(self) -> HttpCall:
        """A cheap call that answers 200 when the server can take requests."""

    @abstractmethod
    def model_info(self) -> HttpCall:
        """The call that reports the loaded model (and, where supported, the weight version)."""

    @abstractmethod
    def parse_version(self, payload: Any) -> int | None:
        """The policy version in a :meth:`model_info` answer; None if the server does not know one."""

    # -- pause / resume ------------------------------------------------------------------------

    @abstractmethod
    def pause(self, mode: PauseMode) -> HttpCall:
        """Stop generating. With ``abort`` every in-flight request must come back with its partial
        output and stop reason ``abort``; requests arriving while paused must wait for resume."""

    @abstractmethod
    def resume(self) -> HttpCall:
        """Generate again (undo :meth:`pause`)."""

    # -- weight updates ------------------------------------------------------------------------

    @abstractmethod
    def update_weights_from_disk(self, meta: WeightUpdateMeta, *, flush_cache: bool = True) -> HttpCall:
        """Load the HF safetensors directory ``meta.path``; the server should report ``meta.version``.

        ``flush_cache`` is False after a pause that left sequences holding KV (``retract`` or
        ``in_place``): SGLang then refuses to flush and fails the update. Servers without the
        notion ignore it."""

    @abstractmethod
    def init_weight_group(self, meta: WeightUpdateMeta, rank_offset: int) -> HttpCall:
        """Join the collective group of ``meta``; this server's ranks start at ``rank_offset``."""

    @abstractmethod
    def update_weights_from_distributed(
        self, meta: WeightUpdateMeta, bucket: Sequence[ParamSpec], *, flush_cache: bool = True
    ) -> HttpCall:
        """Receive one broadcast bucket (one flattened uint8 tensor, see docs) and load it
        (``flush_cache`` as in :meth:`update_weights_from_disk`)."""

    def update_weights_from_shared(
        self, meta: WeightUpdateMeta, layout: Sequence[ParamSpec], *, flush_cache: bool = True
    ) -> HttpCall | None:
        """Copy the weights from the trainer's shared buffers (``meta.shared_buffers``, holding
        ``layout``'s tensors back to back), or None (the default): the backend cannot, and a
        shared update fails with an error that says to use disk or collective updates."""
        del meta, layout, flush_cache
        return None

    @abstractmethod
    def destroy_weight_group(self, group_name: str) -> HttpCall | None:
        """Leave the collective group ``group_name`` joined by :meth:`init_weight_group`, or None
        when the backend has no such call (its group then lives until the server stops).

        Sent to every server while the trainer destroys its side of the group: with NCCL each
        member's destroy may wait for the others, so all of them must enter it together."""

    def begin_weight_update(self, meta: WeightUpdateMeta) -> HttpCall | None:
        """A call sent to every server before the load call(s) of one update (after joining the
        group of a collective one), or None. Default None; vLLM opens its update session here."""
        return None

    def end_weight_update(self, meta: WeightUpdateMeta) -> HttpCall | None:
        """A call sent to every server after the last load call of one update, or None. Default
        None; vLLM applies the update and records ``meta.version`` here."""
        return None

    def swap_weights(self, meta: WeightUpdateMeta, load: HttpCall, mode: PauseMode) -> HttpCall | None:
        """One call that pauses in ``mode``, makes the update's one ``load`` (the call this adapter
        builds for a disk update, a collective one of a single bucket, or a shared one) and
        resumes, answering ``{"timings": {"pause_s", "transfer_s", "resume_s"}}``; or None (the
        default): the client then sends pause, the update's calls and resume one by one. The
        embedded server has one (``/areal/swap_weights``)."""
        del meta, load, mode
        return None

    # -- answers of control calls ------------------------------------------------------------

    def control_error(self, call: HttpCall, status: int, payload: Any) -> str | None:
        """The error in the answer of a control call, or None when it succeeded.

        Default: any non-2xx status, or a JSON object with ``"success": false``, is an error.
        """
        failed_flag = isinstance(payload, dict) and payload.get("success") is False
        if 200 <= status < 300 and not failed_flag:
            return None
        message = payload.get("message", payload) if isinstance(payload, dict) else payload
        return f"{call.method} {call.path} answered HTTP {status}: {str(message)[:500]}"
