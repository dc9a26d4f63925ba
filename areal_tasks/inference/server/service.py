"""The embedded server's operations as coroutines: generation, pause/continue, weights, cache.

:class:`EmbeddedServer` sits between the HTTP routes and the :class:`Engine` thread. Generation
turns each prompt into ``n`` sequences and awaits them; control and weight operations run inside
the engine loop between two decode steps (:meth:`Engine.call`), slow parts (reading safetensors,
receiving broadcasts, the rendezvous) run in worker threads first.

Weight updates live in :class:`~areal_tasks.inference.server.weight_service.WeightService`
(``server.weights``). ``/get_model_info`` and every ``/generate`` answer report the weight version;
a sequence that spans an update carries SGLang's ``weight_versions`` spans.

The request path is bounded (``limits.py``): a request's prompts, samples and stop strings are
checked before anything is queued, the engine's queue bound is set from the limits, and prompt
text is measured before it is tokenised. Tokenising and chat-template rendering run on the
``tokenize`` thread lane (``executors.py``) within ``tokenize_timeout_s``: past it the request is
refused (413 when its own work took too long, counted from its start; 429 when it waited that long
for a thread), so the event loop
keeps answering ``/health`` and every other request. So does the decoding of a request's images
(:meth:`EmbeddedServer.prepare_images`: decode, check, image processor, placeholder expansion and
rotary positions; ``vision.py``), once per request before its sequences are queued; a bad image is
a 400 naming it and never reaches the engine. A request whose handler is cancelled (its
client went away: ``disconnect.py``) aborts its sequences in the engine; a streamed one
(``openai_stream.py``) queues them with :meth:`EmbeddedServer.submit_sequences`, reads them as
they grow and aborts the unfinished ones when its stream ends.

:meth:`EmbeddedServer.health_problem` says what keeps the server from serving (engine thread gone,
a loop iteration far too long, a lane call past its deadline, weight operations stuck, shutdown);
a pause the trainer asked for is not a problem.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from areal_tasks.errors import InferenceError, InferenceLimitError, InferenceRequestError
from areal_tasks.inference.server.deliveries import LoopDeliveries
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.executors import DEFAULT_LANES, LaneBusyError, Lanes, LaneTimeoutError
from areal_tasks.inference.server.limits import ServerLimits, check_request_size, check_stops
from areal_tasks.inference.server.model_runner import ModelRunner
from areal_tasks.inference.server.protocol import generate_response
from areal_tasks.inference.server.request import Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams
from areal_tasks.inference.server.server import WeightBounds
from areal_tasks.inference.server.vision import refuse_images
from areal_tasks.inference.server.weight_service import WeightService

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: an engine iteration (controls, prefill, one decode step) longer than this means the loop is stuck.
ENGINE_STALL_S = 120.0
#: requests waiting for the tokenize lane at most; more are refused with 429 (each holds its body).
MAX_TOKENIZE_PENDING = 64
#: Retry-After of a refusal because the tokenize lane is saturated.
TOKENIZE_RETRY_AFTER_S = 1.0


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the longest entry of ``tokenizer``'s vocabulary, added tokens included."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)


class EmbeddedServer:
    """Async facade over one engine (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        model_path: str,
        served_model_name: str,
        tool_call_parser: str | None = None,
        limits: ServerLimits | None = None,
        weight_bounds: WeightBounds | None = None,
    ) -> None:
        self.engine = engine
        self.tool_call_parser = tool_call_parser
        self.runner: ModelRunner = engine.runner
        self.tokenizer = self.runner.tokenizer
        self.model_path = model_path
        self.served_model_name = served_model_name
        self.weights = WeightService(engine, weight_bounds)
        self.limits = (limits or ServerLimits()).resolve(
            max_running_requests=self.runner.cache.num_slots,
            context_length=self.runner.max_len,
            longest_token_chars=longest_token_chars(self.tokenizer),
        )
        engine.limit_queue(self.limits.max_queued_sequences)
        #: thread lanes for blocking work a request causes (tokenize here; see executors.py).
        self.lanes = Lanes({"tokenize": DEFAULT_LANES["tokenize"]})  # weight lanes are WeightGuard's
        self._tokenize_pending = 0
        self._deliveries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopDeliveries[Sequence]] = (
            weakref.WeakKeyDictionary()
        )
        #: the rids callers gave to requests still in flight (this loop's thread only): a second
        #: request under one of them is refused (an abort by rid would stop both).
        self._live_rids: set[str] = set()
        self.closing = False
        logger.info("request limits: %s", self.limits)

    def close(self, timeout_s: float | None = None) -> None:
        """Server shutdown: ``/health`` says so, the lanes take no more work, weight groups are left
        (each leave bounded by ``timeout_s``; see ``WeightService.close``)."""
        self.closing = True
        self.lanes.shutdown()
        self.weights.close(timeout_s)

    # ---------------- health ----------------
    def health_problem(self) -> str | None:
        """What keeps this server from serving, or None. A pause the trainer asked for is not a
        problem (the fleet restarts unhealthy servers); a loop that stopped, an iteration that does
        not end, a lane call past its deadline or stuck weight operations are."""
        if self.closing:
            return "the server is shutting down"
        problems = []
        if not self.engine.alive:
            problems.append("the engine loop is not running")
        stalled = self.engine.stalled_s()
        if stalled > ENGINE_STALL_S:
            problems.append(f"the engine loop has been in one iteration for {stalled:.0f} s")
        overdue = self.lanes.overdue()
        if overdue:
            problems.append("calls past their deadline: " + "; ".join(overdue))
        stuck = self.weights.stuck_reason()
        if stuck:
            problems.append(stuck)
        return "; ".join(problems) or None

    # ---------------- tokenizing off the event loop ----------------
    async def off_loop(self, fn: Callable[..., T], *args: Any, what: str) -> T:
        """``fn(*args)`` (tokenising, template rendering) on the ``tokenize`` lane within
        ``tokenize_timeout_s``; see the module doc for the refusals."""
        if self._tokenize_pending >= MAX_TOKENIZE_PENDING:
            raise InferenceLimitError(
                f"{MAX_TOKENIZE_PENDING} requests are waiting to be tokenized: try again later",
                retry_after_s=TOKENIZE_RETRY_AFTER_S,
            )
        timeout = self.limits.tokenize_timeout_s
        self._tokenize_pending += 1
        try:  # waiting for a thread and the work itself each get the whole limit
            return await self.lanes.run("tokenize", fn, *args, timeout_s=timeout, wait_s=timeout, what=what)
        except LaneBusyError:
            raise InferenceLimitError(
                f"{what} waited {timeout:g} s for a tokenizer thread: try again later",
                retry_after_s=TOKENIZE_RETRY_AFTER_S,
            ) from None
        except LaneTimeoutError:
            raise InferenceLimitError(
                f"{what} took longer than {timeout:g} s; the input is too large for this server"
            ) from None
        finally:
            self._tokenize_pending -= 1

    # ---------------- images ----------------
    async def prepare_images(self, items: list[dict[str, Any]]) -> None:
        """Ready the images of every item (``image_data``, ``image_field``) for the engine: each item
        with images gets its expanded ``input_ids`` and its ``vision`` inputs. Images for a model
        without a vision tower, bad images and placeholders that do not match them are refused
        (400); the work runs on the tokenize lane."""
        with_images = [item for item in items if item.get("image_data")]
        vision = self.runner.vision
        if vision is None:
            if with_images:
                raise refuse_images(with_images[0].get("image_field", "image_data"))
            return
        if not with_images:
            for item in items:  # a text prompt to a vision model: no placeholders without images
                vision.prepare(item["input_ids"], [])
            return

        def prepare() -> list[tuple[list[int], Any]]:
            return [
                vision.prepare(item["input_ids"], item.get("image_data") or [], item.get("image_field", "image_data"))
                for item in items
            ]

        for item, (ids, prompt) in zip(items, await self.off_loop(prepare, what="decoding the images")):
            item["input_ids"], item["vision"] = ids, prompt

    # ---------------- generation ----------------
    async def generate_sequences(self, items: list[dict[str, Any]]) -> list[Sequence]:
        """Run every item (``input_ids``, ``sampling_params``, ``rid``, ``return_logprob``,
        ``logprob_start_len``, optionally ``top_logprobs_num``: alternatives per position, with
        ``return_logprob`` only) with its ``n`` samples; returns the finished sequences in order.

        Refused before anything is queued when the request passes a limit (``limits.py``); when the
        caller is cancelled (its client went away), its unfinished sequences are aborted."""
        seqs, futures = self.submit_sequences(items)
        try:
            return list(await asyncio.gather(*futures))
        except asyncio.CancelledError:
            self.abort_abandoned(seqs)
            raise

    def submit_sequences(self, items: list[dict[str, Any]]) -> tuple[list[Sequence], list[asyncio.Future[Sequence]]]:
        """Queue every item of :meth:`generate_sequences` (same checks) without waiting: the
        sequences in order (prompt-major, ``n`` each) and a future per sequence that its finish
        resolves on this loop. A streaming caller reads the sequences as they grow and must call
        :meth:`abort_abandoned` when it stops early."""
        loop = asyncio.get_running_loop()
        deliveries = self._deliveries_for(loop)
        seqs: list[Sequence] = []
        futures: list[asyncio.Future[Sequence]] = []

        def on_finish(seq: Sequence, fut: asyncio.Future) -> None:
            deliveries.deliver(fut, seq)

        check_request_size(self.limits, [1] * len(items))
        all_params = [SamplingParams.from_dict(item["sampling_params"]) for item in items]
        check_request_size(self.limits, [p.n for p in all_params])
        for params in all_params:
            check_stops(self.limits, params.stop)
        given = [item["rid"] for item in items if item["rid"]]
        for rid, uses in Counter(given).items():
            if uses > 1:
                raise InferenceRequestError(
                    f"rid {rid!r} names {uses} prompts of this batch; give each prompt a rid of its own",
                    param="rid",
                )
            if rid in self._live_rids:
                raise InferenceRequestError(
                    f"rid {rid!r} is already used by a request in flight; give each request a rid of its own",
                    param="rid",
                )
        for item, params in zip(items, all_params):
            group = SequenceGroup(prompt_ids=[int(t) for t in item["input_ids"]], vision=item.get("vision"))
            base_rid = item["rid"] or uuid.uuid4().hex
            first = len(futures)
            for j in range(params.n):
                fut: asyncio.Future[Sequence] = loop.create_future()
                seed = None if params.sampling_seed is None else params.sampling_seed + j
                seq = Sequence(
                    rid=base_rid if params.n == 1 else f"{base_rid}_{j}",
                    group=group,
                    params=params if seed == params.sampling_seed else _with_seed(params, seed),
                    on_finish=lambda s, f=fut: on_finish(s, f),
                    return_logprob=item["return_logprob"],
                    logprob_start_len=item["logprob_start_len"],
                    top_logprobs_num=item.get("top_logprobs_num", 0) if item["return_logprob"] else 0,
                )
                seqs.append(seq)
                futures.append(fut)
            if item["rid"]:
                self._hold_rid(item["rid"], futures[first:])
        try:
            self.engine.submit(seqs)
        except BaseException:
            self._live_rids.difference_update(given)
            raise
        return seqs, futures

    def _deliveries_for(self, loop: asyncio.AbstractEventLoop) -> LoopDeliveries[Sequence]:
        """The batched hand-over of finished sequences to ``loop`` (``deliveries.py``); one per loop
        (a server has one; tests may drive it from several)."""
        deliveries = self._deliveries.get(loop)
        if deliveries is None:
            deliveries = self._deliveries[loop] = LoopDeliveries(loop)
        return deliveries

    def _hold_rid(self, rid: str, futures: list[asyncio.Future[Sequence]]) -> None:
        """Keep ``rid`` taken until every sequence of its request has finished."""
        self._live_rids.add(rid)
        left = [len(futures)]

        def done(_: asyncio.Future[Sequence]) -> None:
            left[0] -= 1
            if left[0] == 0:
                self._live_rids.discard(rid)

        for fut in futures:
            fut.add_done_callback(done)

    def abort_abandoned(self, seqs: list[Sequence]) -> None:
        """Abort the unfinished ones of ``seqs`` in the engine (nobody waits for them any more)."""
        if all(s.finished for s in seqs):
            return

        def abort() -> int:  # in the engine thread; ``seqs`` stays referenced, so the ids stay theirs
            ids = {id(s) for s in seqs if not s.finished}
            return self.engine.abort_where(lambda s: id(s) in ids, "aborted: the client went away")

        try:
            future = self.engine.call(abort)
        except InferenceError:  # shut down: nothing runs any more
            return

        def done(f: Any) -> None:
            if f.exception() is not None:
                logger.error("aborting the sequences of a cancelled request failed: %s", f.exception())
            else:
                logger.info("a request's client went away: aborted %d of its %d sequences", f.result(), len(seqs))

        future.add_done_callback(done)

    def output_text(self, seq: Sequence) -> str:
        """The decoded output with SGLang's stop trimming (matched stop token / string removed)."""
        ids = seq.output_ids
        matched = (seq.finish_reason or {}).get("matched")
        trim = not seq.params.no_stop_trim
        if trim and isinstance(matched, int) and ids:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)
        if isinstance(matched, str):
            pos = text.find(matched)
            if pos >= 0:
                text = text[: pos + len(matched)] if not trim else text[:pos]
        return text

    def response(self, seq: Sequence, return_text_in_logprobs: bool = False) -> dict[str, Any]:
        """SGLang's ``/generate`` answer for ``seq``."""
        decode = (lambda t: self.tokenizer.decode([t])) if return_text_in_logprobs else None
        return generate_response(seq, self.output_text(seq), decode)

    # ---------------- pause / continue / abort / cache ----------------
    async def pause(self, mode: str) -> int:
        return await asyncio.wrap_future(self.engine.call(lambda: self.engine.pause(mode)))

    async def resume(self) -> None:
        await asyncio.wrap_future(self.engine.call(self.engine.resume))

    async def abort(self, rid: str, abort_all: bool) -> int:
        if abort_all:
            return await asyncio.wrap_future(
                self.engine.call(lambda: self.engine.abort_all("aborted by abort_request"))
            )
        return await asyncio.wrap_future(self.engine.call(lambda: self.engine.abort_rid(rid)))

    async def flush_cache(self) -> tuple[bool, str]:
        """SGLang refuses to flush while requests run or wait; otherwise the KV storage is dropped."""

        def flush() -> tuple[bool, str]:
            if not self.engine.is_idle():
                return False, "Cache not flushed: there are running or waiting requests."
            self.runner.cache.clear()
            return True, "Cache flushed."

        return await asyncio.wrap_future(self.engine.call(flush))

    # ---------------- info ----------------
    def model_info(self) -> dict[str, Any]:
        config = self.runner.config
        return {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.runner.cfg.tokenizer_path or self.runner.cfg.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.engine.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": self.tool_call_parser,
            "disaggregation_mode": "null",
            "has_image_understanding": self.runner.vision is not None,
            "has_audio_understanding": False,
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
        }


def _with_seed(params: SamplingParams, seed: int | None) -> SamplingParams:
    return replace(params, sampling_seed=seed)
