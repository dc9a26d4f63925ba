"""``RemoteInferenceEngine``: the one client core behind every backend (see ``protocol.py``).

One request (:meth:`RemoteInferenceEngine.agenerate`) is a loop of *attempts*:

1. wait while the engine is paused;
2. pick a server (affinity to the server of the previous piece, else least loaded, live first);
3. send ``prompt + tokens so far`` with the budget left, under the concurrency cap and the request
   timeout; on a connection error, timeout or 408/429/5xx, back off exponentially and try again
   (elsewhere: the failed server is avoided, a refusing one is marked dead) until ``max_retries``;
   a 429 with ``Retry-After`` (a full queue) goes to another server at once if one is left to try,
   else waits that long, and spends no retry while the request timeout lasts (``retry.py``);
4. append the returned tokens, each tagged with the version the server reports for it or else the
   version in effect when the answer arrived (see ``versions.py``);
5. stop on ``stop``/``length``; on an ``abort`` (a pause) resubmit, which waits for resume.

An attempt the client abandons while it may be running on its server (its timeout fired, the
caller cancelled the request, or a broken connection sends it elsewhere) is stopped there: a
background task sends the adapter's :meth:`~.protocol.ProtocolAdapter.abort` call, bounded by
``abort_timeout_s``, and logs its outcome instead of raising; :meth:`RemoteInferenceEngine.aclose`
waits for the ones still running. So an abandoned request stops burning decode steps and a retried
one does not run twice. An attempt the server itself cut short (stop reason ``abort``, e.g. a pause
for a weight update) was answered, so it is resubmitted and never aborted by the client.

Attempt ids are ``<rid>-<NNNN>``, so no attempt id is a prefix of another (SGLang aborts by prefix);
rids that are prefixes of one another (``a`` and ``a-0000``) would defeat this, the default uuid
rids never are.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.api.inference import (
    InferenceEngine,
    ModelRequest,
    ModelResponse,
    ParamSpec,
    PauseMode,
    SamplingParams,
)
from areal_tasks.errors import (
    InferenceConnectionError,
    InferenceError,
    InferenceRequestError,
    InferenceRetriesExhaustedError,
    InferenceTimeoutError,
)
from areal_tasks.inference.client.balance import ServerPool, ServerState
from areal_tasks.inference.client.config import ClientConfig
from areal_tasks.inference.client.control import fan_out, probe_all
from areal_tasks.inference.client.protocol import GenerateInput, GenerateOutput, ProtocolAdapter
from areal_tasks.inference.client.retry import RetryPolicy, is_retryable_status, overload_wait
from areal_tasks.inference.client.transport import HttpTransport, may_have_reached_server
from areal_tasks.inference.client.versions import VersionTimeline
from areal_tasks.inference.client.weights import WeightSync
from areal_tasks.trace import span

if TYPE_CHECKING:
    import httpx

    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.config.rollout import RolloutConfig

logger = logging.getLogger(__name__)

__all__ = ["InflightRequest", "RemoteInferenceEngine"]


@dataclass
class InflightRequest:
    """Progress of one request being generated (see :meth:`RemoteInferenceEngine.inflight`)."""

    rid: str
    server: str
    n_output_tokens: int
    n_resubmits: int
    held: bool


@dataclass
class _Piece:
    output: GenerateOutput
    server: str
    versions: list[int]
    sent_at: float
    answered_at: float


class _LoopState:
    """Synchronisation objects of one event loop (asyncio primitives bind to the loop that uses them)."""

    def __init__(self, max_concurrent: int, paused: bool) -> None:
        self.slots = asyncio.Semaphore(max_concurrent)
        self.resumed = asyncio.Event()
        if not paused:
            self.resumed.set()


class RemoteInferenceEngine(InferenceEngine):
    """An :class:`InferenceEngine` over N HTTP servers of one backend.

    Its controls (pause, weight updates, resume) may run on another event loop than its requests
    (``control_from_any_loop``): a pause holds the requests of every loop that sends them.

    Args:
        addresses: the servers, ``host:port`` or base URLs.
        adapter: the backend's protocol (``make_adapter(name)``).
        config: timeouts, retries, caps.
        version: the policy version the servers hold now.
        sleep: the backoff sleep (tests record it).
        transport_factory: an ``httpx`` transport factory (tests use ``httpx.MockTransport``).
    """

    control_from_any_loop = True

    def __init__(
        self,
        addresses: Sequence[str],
        adapter: ProtocolAdapter,
        config: ClientConfig | None = None,
        *,
        version: int = 0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        transport_factory: Callable[[], httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        self.config = config or ClientConfig()
        self.adapter = adapter
        self._pool = ServerPool(addresses, self.config.dead_cooldown_s)
        self._transport = HttpTransport(
            connect_timeout_s=self.config.connect_timeout_s,
            max_connections=self.config.max_concurrent + 2 * len(addresses) + 4,
            transport_factory=transport_factory,
            api_key=self.config.api_key,
            admin_api_key=self.config.admin_api_key,
        )
        self._weights = WeightSync(self._transport, adapter, self.config.ranks_per_server, self.config.update_timeout_s)
        self._retry = RetryPolicy(
            self.config.max_retries, self.config.retry_backoff_s, self.config.max_backoff_s, self.config.retry_jitter
        )
        self._rng = random.Random()
        self._sleep = sleep
        self._version = version
        self._timeline = VersionTimeline(version)
        self._paused = False
        #: the mode of the pause in force (None when running): a weight update flushes the KV
        #: cache only when no sequence holds KV any more (see :meth:`update_weights`).
        self._pause_mode: PauseMode | None = None
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._loops_lock = threading.Lock()
        self._inflight: dict[str, InflightRequest] = {}
        #: background aborts of abandoned attempts (see :meth:`_abandon`), over all event loops.
        self._aborts: set[asyncio.Task[None]] = set()

    @classmethod
    def from_rollout(
        cls, rollout: RolloutConfig, addresses: Sequence[str], *, ranks_per_server: int = 1, version: int = 0
    ) -> RemoteInferenceEngine:
        """The engine of a job's ``rollout`` section (backend, timeouts, retries, concurrency)."""
        from areal_tasks.inference.registry import make_adapter

        config = ClientConfig.from_rollout(rollout, ranks_per_server=ranks_per_server)
        return cls(addresses, make_adapter(rollout.backend), config, version=version)

    # -- servers -------------------------------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        """Server base URLs, in order (the order of collective rank offsets)."""
        return self._pool.addresses

    def set_servers(self, addresses: Sequence[str]) -> None:
        """Replace the server list (e.g. after the fleet restarted a server on a new port)."""
        self._pool.set_addresses(addresses)

    def server_states(self) -> list[ServerState]:
        """Load and health book-keeping of every server."""
        return self._pool.snapshot()

    def inflight(self) -> list[InflightRequest]:
        """Requests being generated now; ``held`` ones wait for :meth:`resume` with a partial output."""
        return [InflightRequest(**vars(r)) for r in self._inflight.values()]

    async def check_health(self) -> dict[str, bool]:
        """``address -> healthy`` for every server (never raises)."""
        results = await probe_all(
            self._transport, self.adapter, self.addresses, self.adapter.health(), self.config.control_timeout_s
        )
        return {a: err is None for a, (err, _) in results.items()}

    async def server_versions(self) -> dict[str, int | None]:
        """``address -> weight version the server reports`` (raises InferenceControlError on failure)."""
        payloads = await fan_out(
            self._transport,
            self.adapter,
            self.addresses,
            lambda i, a: self.adapter.model_info(),
            self.config.control_timeout_s,
            "model_info",
        )
        return {a: self.adapter.parse_version(p) for a, p in zip(self.addresses, payloads)}

    # -- InferenceEngine -----------------------------------------------------------------------

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        if not isinstance(version, int) or version < 0:
            raise InferenceError(f"set_version: version must be an int >= 0, got {version!r}")
        self._version = version
        self._timeline.reset(version)

    async def pause(self, mode: PauseMode = "abort") -> None:
        self._paused = True
        self._pause_mode = mode  # before the calls: a half-done pause may have kept KV somewhere
        self._gate_requests(open_=False)
        await fan_out(
            self._transport,
            self.adapter,
            self.addresses,
            lambda i, a: self.adapter.pause(mode),
            self.config.control_timeout_s,
            f"pause({mode})",
        )
        logger.info("paused %d servers (mode=%s)", len(self.addresses), mode)

    async def resume(self) -> None:
        self._timeline.resuming()  # before the calls: a server may start generating on receipt
        await fan_out(
            self._transport,
            self.adapter,
            self.addresses,
            lambda i, a: self.adapter.resume(),
            self.config.control_timeout_s,
            "resume",
        )
        self._paused = False
        self._pause_mode = None
        self._gate_requests(open_=True)
        logger.info("resumed %d servers at version %d", len(self.addresses), self._version)

    async def update_weights(
        self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None = None
    ) -> None:
        # after a retract/in_place pause sequences still hold KV of the old weights: SGLang (and the
        # embedded server) fail an update that asks to flush then, so ask only after abort or unpaused
        flush_cache = self._pause_mode in (None, "abort")
        await self._weights.update(self.addresses, meta, buckets, flush_cache=flush_cache)
        self._version = meta.version
        self._timeline.updated(meta.version, paused=self._paused)
        logger.info("weights of version %d loaded on %d servers (%s)", meta.version, len(self.addresses), meta.type)

    async def swap_weights(
        self, meta: WeightUpdateMeta, buckets: Sequence[Sequence[ParamSpec]] | None = None, mode: PauseMode = "abort"
    ) -> dict[str, float]:
        """Pause, load ``meta`` and resume. Where the backend can, this is one request per server
        (the embedded server's ``/areal/swap_weights``: four round trips fewer inside the pause);
        the parts' seconds are then the slowest server's pause and resume and the rest of the wall
        time. Otherwise the three steps of :class:`InferenceEngine`, where a failed load leaves the
        servers paused, as a failed :meth:`update_weights` between pause and resume does. A failed
        one-request swap does not: every server resumed on its old weights whatever its load did,
        so the client lets requests through again and keeps its version before it raises."""
        call = self._weights.swap_call(meta, buckets, mode, flush_cache=mode == "abort")
        if call is None:  # pause, load and resume as three requests to every server
            with span("swap request", "weights", version=meta.version, type=meta.type, n_servers=len(self.addresses)):
                return await super().swap_weights(meta, buckets, mode)
        started = time.perf_counter()
        self._paused = True
        self._pause_mode = mode
        self._gate_requests(open_=False)
        try:
            with span("swap request", "weights", version=meta.version, type=meta.type, n_servers=len(self.addresses)):
                timings = await self._weights.swap(self.addresses, meta, call)
        except BaseException:
            self._paused = False
            self._pause_mode = None
            self._gate_requests(open_=True)
            raise
        self._version = meta.version
        self._timeline.updated(meta.version, paused=True)
        self._timeline.resuming()
        self._paused = False
        self._pause_mode = None
        self._gate_requests(open_=True)
        took = time.perf_counter() - started
        pause = max((t.get("pause_s", 0.0) for t in timings), default=0.0)
        resume = max((t.get("resume_s", 0.0) for t in timings), default=0.0)
        logger.info(
            "swapped in weights of version %d on %d servers in one request each (%s, %.1f ms)",
            meta.version,
            len(self.addresses),
            meta.type,
            1e3 * took,
        )
        return {"pause": pause, "transfer": max(took - pause - resume, 0.0), "resume": resume}

    @property
    def weight_groups(self) -> list[str]:
        """Names of the collective weight-update groups the servers joined (and have not left)."""
        return self._weights.group_names

    async def destroy_weight_groups(
        self, group_name: str | None = None, *, timeout_s: float | None = None
    ) -> list[str]:
        """Make every server leave the collective weight-update groups it joined (all, or ``group_name``).

        Call it while the trainer destroys its side of the group (with NCCL both must enter the
        teardown together). The groups are forgotten even when a server fails; a later collective
        update joins afresh. ``timeout_s`` bounds each server's answer (default
        ``control_timeout_s``). Returns the names of the groups left; raises InferenceControlError
        naming the servers that failed.
        """
        timeout = self.config.control_timeout_s if timeout_s is None else timeout_s
        return await self._weights.destroy_groups(timeout, group_name)

    async def aclose(self) -> None:
        """Wait for the aborts of abandoned attempts still running (each bounded by
        ``abort_timeout_s``), then close the connections of the running event loop."""
        loop = asyncio.get_running_loop()
        pending = [t for t in self._aborts if t.get_loop() is loop and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.config.abort_timeout_s + 1.0)
        await self._transport.aclose()

    async def __aenter__(self) -> RemoteInferenceEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        with span("generate", "generate", concurrent=True, rid=req.rid) as traced:
            response = await self._agenerate(req)
            traced.set(n_tokens=len(response.output_ids), n_resubmits=response.n_resubmits)
            return response

    async def _agenerate(self, req: ModelRequest) -> ModelResponse:
        start = time.monotonic()
        progress = InflightRequest(req.rid, server="", n_output_tokens=0, n_resubmits=0, held=False)
        self._inflight[req.rid] = progress
        out_ids: list[int] = []
        out_logprobs: list[float] = []
        out_versions: list[int] = []
        ttft: float | None = None
        attempt = 0
        try:
            while True:
                remaining = req.sampling.max_new_tokens - len(out_ids)
                if remaining <= 0:
                    stop_reason = "length"
                    break
                prefix = list(req.input_ids) + out_ids
                sampling = req.sampling.with_max_new_tokens(remaining)
                piece, attempt = await self._generate_piece(
                    req.rid, prefix, sampling, progress, attempt, req.image_data
                )
                out = piece.output
                if ttft is None and out.output_ids:
                    first = out.first_token_latency_s
                    ttft = (piece.sent_at - start) + (first if first is not None else piece.answered_at - piece.sent_at)
                out_ids += out.output_ids
                out_logprobs += out.output_logprobs
                out_versions += piece.versions
                progress.server, progress.n_output_tokens = piece.server, len(out_ids)
                if out.stop_reason != "abort":
                    stop_reason = out.stop_reason
                    break
                if out.error is not None:
                    raise InferenceRequestError(f"request {req.rid}: server {piece.server} aborted it: {out.error}")
                progress.n_resubmits += 1
                if progress.n_resubmits > self.config.max_resubmits:
                    raise InferenceError(
                        f"request {req.rid} was aborted {progress.n_resubmits} times (max_resubmits="
                        f"{self.config.max_resubmits}); {len(out_ids)} tokens generated so far"
                    )
                logger.debug(
                    "request %s aborted after %d tokens on %s; resubmitting", req.rid, len(out_ids), piece.server
                )
        finally:
            self._inflight.pop(req.rid, None)
        latency = time.monotonic() - start
        return ModelResponse(
            rid=req.rid,
            input_ids=list(req.input_ids),
            output_ids=out_ids,
            output_logprobs=out_logprobs,
            output_versions=out_versions,
            stop_reason=stop_reason,
            ttft_s=latency if ttft is None else ttft,
            latency_s=latency,
            n_resubmits=progress.n_resubmits,
            server=progress.server,
        )

    # -- one piece, with retries -----------------------------------------------------------------

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            with self._loops_lock:  # a pause on another loop reads the states; it sets _paused first
                state = self._loops.get(loop)
                if state is None:
                    state = self._loops[loop] = _LoopState(self.config.max_concurrent, self._paused)
        return state

    def _gate_requests(self, *, open_: bool) -> None:
        """Open (resume) or close (pause) the gate new attempts wait at, on every event loop that
        sends requests. Another loop's gate changes on that loop's next turn
        (``call_soon_threadsafe``): before it reads any answer to a call sent after this one, so
        an attempt a pause aborted waits there for the resume."""
        running = asyncio.get_running_loop()
        self._state()
        with self._loops_lock:
            states = list(self._loops.items())
        for loop, state in states:
            change = state.resumed.set if open_ else state.resumed.clear
            if loop is running:
                change()
                continue
            with contextlib.suppress(RuntimeError):  # that loop is closed: nothing waits on it any more
                loop.call_soon_threadsafe(change)

    async def _wait_resumed(self, progress: InflightRequest) -> None:
        state = self._state()
        if not state.resumed.is_set():
            progress.held = True
            await state.resumed.wait()
            progress.held = False

    async def _generate_piece(
        self,
        rid: str,
        input_ids: list[int],
        sampling: SamplingParams,
        progress: InflightRequest,
        attempt: int,
        image_data: tuple[str, ...] = (),
    ) -> tuple[_Piece, int]:
        """Send one piece until a server answers it; returns the piece and the next attempt number.
        A piece of a prompt with images carries them again (``input_ids`` is the prompt, its
        placeholders expanded, plus the output so far)."""
        failures: list[str] = []
        tried: set[str] = set()
        retries = waits = 0
        # full queues (429 + Retry-After) are waited out without spending retries until then
        overload_deadline = time.monotonic() + self.config.request_timeout_s
        while True:
            await self._wait_resumed(progress)
            server = self._pool.choose(affinity=progress.server or None, avoid=tried)
            inp = GenerateInput(f"{rid}-{attempt:04d}", input_ids, sampling, image_data)
            attempt += 1
            try:
                piece = await self._send(server, inp)
            except InferenceTimeoutError as exc:
                failures.append(f"{server}: {exc}")
            except InferenceConnectionError as exc:
                self._pool.mark_dead(server)
                failures.append(f"{server}: {exc}")
            except _RetryableStatus as exc:
                tried.add(server)
                wait = self._overload_wait(exc.retry_after_s, tried, overload_deadline)
                if wait is not None:
                    waits += 1
                    progress.server = ""
                    logger.info("request %s: %s; trying again in %.1fs (no retry spent)", rid, exc, wait)
                    if wait > 0:
                        await self._sleep(wait)
                    continue
                failures.append(f"{server}: {exc}")
            else:
                self._pool.mark_ok(server)
                return piece, attempt
            tried.add(server)
            progress.server = ""  # affinity is void once its server failed
            if retries >= self.config.max_retries:
                break
            delay = self._retry.delay(retries, self._rng)
            retries += 1
            logger.warning(
                "request %s: %s; retry %d/%d in %.2fs", rid, failures[-1], retries, self.config.max_retries, delay
            )
            await self._sleep(delay)
        waited = f" (and waited out {waits} full queues)" if waits else ""
        raise InferenceRetriesExhaustedError(
            f"request {rid} failed {len(failures)} times{waited} "
            f"(max_retries={self.config.max_retries}): " + "; ".join(failures)
        )

    def _overload_wait(self, retry_after_s: float | None, tried: set[str], deadline: float) -> float | None:
        """How long to wait before the next attempt after a 429 with ``Retry-After``, spending no
        retry: 0 when a live server is left untried, else the server's ``Retry-After``; None (a
        counted failure) without one, or when the wait would pass the request timeout."""
        if retry_after_s is None:
            return None
        if any(a not in tried and self._pool.is_alive(a) for a in self._pool.addresses):
            return 0.0
        return overload_wait(retry_after_s, deadline - time.monotonic())

    async def _send(self, server: str, inp: GenerateInput) -> _Piece:
        call = self.adapter.generate(inp)
        async with self._state().slots:
            self._pool.acquire(server)
            sent_at = time.monotonic()
            try:
                with span("generate request", "generate", concurrent=True, rid=inp.rid, server=server):
                    answer = await self._transport.exchange(server, call, self.config.request_timeout_s)
            except asyncio.CancelledError:
                self._abandon(server, inp.rid, "cancelled by the caller")
                raise
            except InferenceConnectionError as exc:  # a timeout too
                if may_have_reached_server(exc):
                    self._abandon(server, inp.rid, str(exc))
                raise
            finally:
                self._pool.release(server)
        answered_at = time.monotonic()
        status, payload = answer.status, answer.payload
        if status != 200:
            if is_retryable_status(status):
                retry_after = answer.retry_after_s if status == 429 else None
                raise _RetryableStatus(f"HTTP {status}: {str(payload)[:300]}", retry_after)
            raise InferenceRequestError(
                f"request {inp.rid}: server {server} refused it with HTTP {status}: {str(payload)[:500]}"
            )
        output = self.adapter.parse_generate(payload, inp)
        reported = output.versions or [None] * len(output.output_ids)
        if len(reported) != len(output.output_ids) or len(output.output_logprobs) != len(output.output_ids):
            raise InferenceRequestError(
                f"request {inp.rid}: {self.adapter.name} adapter returned {len(output.output_ids)} tokens, "
                f"{len(output.output_logprobs)} logprobs and {len(reported)} versions"
            )
        fallback = self._timeline.at(answered_at)
        versions = [fallback if v is None else v for v in reported]
        return _Piece(output, server, versions, sent_at, answered_at)

    # -- aborting abandoned attempts ------------------------------------------------------------

    def _abandon(self, server: str, rid: str, why: str) -> None:
        """Stop attempt ``rid`` on ``server`` in the background: the caller moves on at once (a
        cancellation is not delayed, a retry does not wait for the abort)."""
        logger.debug("attempt %s on %s abandoned (%s); aborting it there", rid, server, why)
        task = asyncio.get_running_loop().create_task(self._abort(server, rid), name=f"abort {rid}")
        self._aborts.add(task)
        task.add_done_callback(self._abort_done)

    async def _abort(self, server: str, rid: str) -> None:
        call = self.adapter.abort(rid)
        if call is None:
            logger.debug("attempt %s: %s stops it when its connection closes; no abort call", rid, self.adapter.name)
            return
        try:
            status, payload = await self._transport.send(server, call, self.config.abort_timeout_s)
        except InferenceConnectionError as exc:
            logger.warning("attempt %s: abort on %s failed, it may still run there: %s", rid, server, exc)
            return
        error = self.adapter.control_error(call, status, payload)
        if error is not None:
            logger.warning("attempt %s: abort on %s failed, it may still run there: %s", rid, server, error)
        else:
            logger.debug("attempt %s aborted on %s", rid, server)

    def _abort_done(self, task: asyncio.Task[None]) -> None:
        """Forget a finished abort; an unexpected error becomes a warning (it never reaches a caller)."""
        self._aborts.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            logger.warning("%s failed unexpectedly", task.get_name(), exc_info=(type(exc), exc, exc.__traceback__))


class _RetryableStatus(InferenceError):
    """A server answered a status worth retrying (internal to the core); ``retry_after_s``: the
    ``Retry-After`` of a 429."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
