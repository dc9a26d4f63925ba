"""The InferenceEngine interface and its wire types: what rollout code asks of the inference servers.

A rollout workflow builds a :class:`ModelRequest` (prompt token ids + :class:`SamplingParams`) and
awaits :meth:`InferenceEngine.agenerate`, which returns a :class:`ModelResponse`: the output token
ids, their behaviour logprobs, **the policy version that produced every output token**, the stop
reason and timings. The controller drives weight updates through the same object:
``await engine.pause(); await engine.update_weights(meta); await engine.resume()``.

Partial rollout: a request in flight when the servers are paused returns early with whatever it
generated; the engine resubmits ``prompt + partial output`` once the servers resume (to the same
server) and concatenates the pieces, so one response can hold tokens of two or more versions
(``output_versions`` is non-decreasing within a response).

Collective weight updates travel in buckets planned by :func:`plan_weight_buckets`; the trainer's
sender and the inference client both use that one plan, so both sides agree on the byte layout of
every broadcast (see ``docs/inference.md``).

This module is torch-free.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.config.rollout import SamplingConfig

logger = logging.getLogger(__name__)

__all__ = [
    "DTYPE_BYTES",
    "InferenceEngine",
    "ModelRequest",
    "ModelResponse",
    "ParamSpec",
    "PauseMode",
    "SamplingParams",
    "StopReason",
    "new_rid",
    "plan_weight_buckets",
]

StopReason = Literal["stop", "length", "abort"]
#: SGLang's pause modes: ``abort`` returns in-flight requests with their partial output (partial
#: rollout); ``retract``/``in_place`` keep them on the server and continue after resume.
PauseMode = Literal["abort", "retract", "in_place"]

#: bytes per element of the dtypes that may travel in a weight update (names as ``torch.<name>``).
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def new_rid() -> str:
    """A fresh request id (32 hex digits; never a prefix of another, which SGLang's abort relies on)."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion; maps one to one onto SGLang's ``sampling_params``."""

    #: maximum generated tokens (over all resubmissions of a partial rollout).
    max_new_tokens: int = 256
    #: softmax temperature; 0 = greedy.
    temperature: float = 1.0
    #: nucleus sampling mass, in (0, 1].
    top_p: float = 1.0
    #: sample from the top k tokens; -1 = no limit.
    top_k: int = -1
    #: stop strings.
    stop: tuple[str, ...] = ()
    #: stop token ids (in addition to EOS).
    stop_token_ids: tuple[int, ...] = ()
    #: keep generating past EOS until ``max_new_tokens``.
    ignore_eos: bool = False
    #: sampling seed; None = nondeterministic.
    seed: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        problems = []
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            problems.append(f"max_new_tokens={self.max_new_tokens!r} must be an int >= 1")
        if not self.temperature >= 0:
            problems.append(f"temperature={self.temperature!r} must be >= 0")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p!r} must be in (0, 1]")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            problems.append(f"top_k={self.top_k!r} must be -1 (no limit) or an int >= 1")
        if problems:
            raise ConfigError("invalid SamplingParams: " + "; ".join(problems))

    @classmethod
    def from_config(cls, cfg: SamplingConfig) -> SamplingParams:
        """The sampling parameters of a ``rollout.sampling`` config section."""
        return cls(
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            stop=tuple(cfg.stop),
            stop_token_ids=tuple(cfg.stop_token_ids),
            ignore_eos=cfg.ignore_eos,
            seed=cfg.seed,
        )

    def with_max_new_tokens(self, max_new_tokens: int) -> SamplingParams:
        """A copy with another token budget (used when a partial rollout is resubmitted)."""
        return replace(self, max_new_tokens=max_new_tokens)


@dataclass(frozen=True)
class ModelRequest:
    """One generation request: a tokenized prompt and how to sample from it."""

    input_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    #: request id; unique per request (resubmissions of a partial rollout derive theirs from it).
    rid: str = field(default_factory=new_rid)
    #: images of a vision-language prompt, in the order of their placeholders in ``input_ids``: each
    #: base64 text of PNG/JPEG bytes or a ``data:image/...;base64,`` URL (SGLang's ``image_data``).
    #: ``input_ids`` hold the placeholders expanded as the model's processor expands them.
    image_data: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ConfigError(f"ModelRequest {self.rid}: input_ids must not be empty")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.input_ids):
            raise ConfigError(f"ModelRequest {self.rid}: input_ids must be non-negative ints")
        object.__setattr__(self, "image_data", tuple(self.image_data))
        if not all(isinstance(image, str) and image for image in self.image_data):
            raise ConfigError(f"ModelRequest {self.rid}: image_data must hold non-empty base64 strings or data URLs")


@dataclass
class ModelResponse:
    """The completed generation of one :class:`ModelRequest`.

    ``output_ids``, ``output_logprobs`` and ``output_versions`` are aligned: token ``i`` was sampled
    with logprob ``output_logprobs[i]`` by the weights of policy version ``output_versions[i]``.
    """

    rid: str
    input_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    stop_reason: StopReason
    #: seconds from submission to the first output token (see docs/inference.md for how it is measured).
    ttft_s: float
    #: seconds from submission to the final answer, including waits for a paused server.
    latency_s: float
    #: times the request was resubmitted after a pause (partial rollout) or a server abort.
    n_resubmits: int = 0
    #: address of the server that produced the last piece.
    server: str = ""

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.output_logprobs) != n or len(self.output_versions) != n:
            raise ConfigError(
                f"ModelResponse {self.rid}: output_ids ({n}), output_logprobs ({len(self.output_logprobs)}) "
                f"and output_versions ({len(self.output_versions)}) must have the same length"
            )

    @property
    def output_len(self) -> int:
        """Number of generated tokens."""
        return len(self.output_ids)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelResponse:
        """Rebuild from :meth:`to_dict` output."""
        return cls(**data)


@dataclass(frozen=True)
class ParamSpec:
    """Name, dtype (``torch.<dtype>`` name, e.g. ``bfloat16``) and shape of one tensor of a weight update."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"ParamSpec {self.name}: dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        """Bytes of the whole tensor."""
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * self.itemsize


def plan_weight_buckets(specs: Sequence[ParamSpec], bucket_bytes: int) -> list[list[ParamSpec]]:
    """Split ``specs`` into broadcast buckets of at most ``bucket_bytes`` (a bigger tensor goes alone).

    Tensors keep their order across buckets; inside a bucket they are ordered by element size,
    largest first (stable), so that every tensor's byte offset in the flattened bucket is a multiple
    of its element size, as SGLang's ``flattened_bucket`` receiver requires. The trainer sends each
    bucket as one ``uint8`` tensor: the listed tensors' bytes back to back, in this order.
    """
    if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise ConfigError(f"bucket_bytes={bucket_bytes!r} must be an int >= 1")
    buckets: list[list[ParamSpec]] = []
    current: list[ParamSpec] = []
    used = 0
    for spec in specs:
        if current and used + spec.nbytes > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append(spec)
        used += spec.nbytes
    if current:
        buckets.append(current)
    return [sorted(bucket, key=lambda s: -s.itemsize) for bucket in buckets]


class InferenceEngine(ABC):
    """Generation on a fleet of inference servers plus the controls a weight update needs.

    All methods but the version accessors and :meth:`generate_batch` are coroutines of one event
    loop (the rollout executor's). Implementations: the shared HTTP client core
    (``areal_tasks.inference.client``) with one thin protocol adapter per backend.
    """

    #: whether :meth:`pause`, :meth:`update_weights`, :meth:`resume` and :meth:`swap_weights` may run
    #: on an event loop other than the one the requests run on, while they run: a pause must then
    #: hold the requests of every loop. The rollout executor sends weight swaps from a control loop
    #: of its own when it may (``areal_tasks.rollout.control_loop``), so a swap does not queue
    #: behind the episodes' work on theirs.
    control_from_any_loop: ClassVar[bool] = False

    @abstractmethod
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate one completion; survives pauses (partial rollout), retries and dead servers.

        Raises :class:`~areal_tasks.errors.InferenceRequestError` when a server refuses the request
        and :class:`~areal_tasks.errors.InferenceRetriesExhaustedError` when every attempt failed.
        """

    @abstractmethod
    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop generation on every server; with ``abort`` in-flight requests return their partial
        output and are held by the engine until :meth:`resume`."""

    @abstractmethod
    async def resume(self) -> None:
        """Let every server generate again and release the held requests."""

    @abstractmethod
    async def update_weights(
        self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None = None
    ) -> None:
        """Load the weights named by ``meta`` on every server, then set the version to ``meta.version``.

        ``disk``: every server loads the safetensors under ``meta.path``. ``collective``: the
        servers join the group (first time only) and receive ``buckets`` (required; from
        :func:`plan_weight_buckets`) while the trainer broadcasts them; run the trainer's send
        concurrently with this call. Raises :class:`~areal_tasks.errors.InferenceControlError`.
        """

    async def swap_weights(
        self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None = None, mode: PauseMode = "abort"
    ) -> dict[str, float]:
        """A whole weight update: :meth:`pause` in ``mode``, :meth:`update_weights`, :meth:`resume`;
        returns the seconds of each part (``pause``, ``transfer``, ``resume``).

        This default makes the three calls; an engine whose servers can do all three in one request
        overrides it (the HTTP client does, for the embedded server). As with :meth:`update_weights`,
        run the trainer's send of a collective update concurrently with this call.
        """
        import time

        started = time.perf_counter()
        await self.pause(mode)
        paused = time.perf_counter()
        await self.update_weights(meta, buckets)
        loaded = time.perf_counter()
        await self.resume()
        return {"pause": paused - started, "transfer": loaded - paused, "resume": time.perf_counter() - loaded}

    @abstractmethod
    def get_version(self) -> int:
        """The policy version new tokens are tagged with."""

    @abstractmethod
    def set_version(self, version: int) -> None:
        """Set the policy version (e.g. after recovering from a checkpoint)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections of the running event loop; the engine may be used again afterwards."""

    async def agenerate_batch(self, reqs: Sequence[ModelRequest]) -> list[ModelResponse]:
        """Generate all of ``reqs`` concurrently (bounded by the engine's concurrency cap), in order."""
        return list(await asyncio.gather(*(self.agenerate(r) for r in reqs)))

    def generate_batch(self, reqs: Sequence[ModelRequest]) -> list[ModelResponse]:
        """Blocking :meth:`agenerate_batch` for code without an event loop (scripts, evaluation)."""

        async def run() -> list[ModelResponse]:
            try:
                return await self.agenerate_batch(reqs)
            finally:
                await self.aclose()

        return asyncio.run(run())
