"""The engine loop: continuous batching over the model runner, in one background thread.

The loop owns the runner (model, KV cache). Other threads talk to it only through
:meth:`Engine.submit` (new sequences) and :meth:`Engine.call` (a function run inside the loop
between two steps: pause, continue, weight swaps, cache flush). One iteration:

1. run queued control calls;
2. unless paused, admit waiting sequences into free KV slots (``prefill.py``: fresh prompts are
   prefilled together; a sibling of an ``n > 1`` request copies the prompt's KV from a live
   sibling; with the prefix cache, a prompt whose KV is cached copies it and prefills only the
   rest), sampling each one's first token from its prefill logits;
3. unless paused, compact the running sequences into slots ``0..B-1``, run one decode step over
   all of them, sample, and retire the finished ones, freeing their slots.

So requests join and leave the running batch between decode steps.

**Bursts** (``burst_quiet_s``, 1 ms by default; 0 turns it off): an idle engine (nothing running,
nothing in flight) that finds requests waiting lets the burst they arrived in settle before it
admits: it waits until no request has arrived for ``burst_quiet_s`` (at most
:data:`BURST_MAX_WAIT_S`, and never once the queue fills the free slots, or a control call or a
stop arrives). Over HTTP a burst's requests reach the engine one by one, each after its handler
ran; without the wait the first of them were prefilled alone (one more prefill, of a shape of its
own) while the rest arrived, and the batch started decoding behind them. A busy engine never waits:
its decode steps batch the arrivals between them.

**Prefix cache** (``prefix_cache.py``; off by default, ``prefix_cache=True`` / ``areal serve
--enable-prefix-cache`` turns it on: on an H200 it cut the throughput benchmark's greedy decode
from 97.6k to 9.3k tokens/s, because a wave of prompts over full retained slots evicted its own
entries and prefilled them one sequence at a time; fixed since, but not yet re-measured on a GPU;
docs/inference.md): a sequence leaving its slot keeps its KV there as a cache entry while
the slot is free, and new prompts reuse cached prefixes. Every weight change
(:meth:`Engine.weights_changed`) and every failed decode step drops all entries. On a runner
whose captured decode steps pad the batch (``cuda_graph.py``: padding rows write position 0 of
the free slots above the batch) the retained entries of those slots move above the padding (or
are dropped, without room) before the step.

**Overlap** (on by default, ``overlap=False`` turns it off): the decode step (``decode_step.py``)
launches step N+1 before the host reads back step N. Control calls (pause, weight updates, aborts)
first read the step in flight, so they always see every sampled token, under the weights that
produced it.

Pause modes follow SGLang:
``abort`` finishes every running and waiting sequence with its partial output and finish reason
``abort``; ``in_place`` freezes running sequences with their KV; ``retract`` frees their KV and puts
them back at the head of the queue, to be prefilled again (prompt + output so far) on continue.
New requests wait in the queue while paused.

**Admission** (:meth:`Engine.submit`) is where every route's sequences enter, so the queue bound
is kept there: with :meth:`Engine.limit_queue` set, a request that would take the sequences
running, waiting and held past it is refused with :class:`~areal_tasks.errors.InferenceLimitError`
carrying a ``Retry-After`` estimated from the recent finish rate. **Aborts** name a request
exactly: its rid, which also stops the ``<rid>_<j>`` samples of an ``n > 1`` request (and the
``<rid>_<i>`` prompts of a batch), never another request whose rid merely starts with it.
A **heartbeat** (:meth:`Engine.stalled_s`) tells ``/health`` how long the loop has been inside one
iteration while it had work.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch

from areal_tasks.errors import InferenceError, InferenceLimitError, InferenceRequestError
from areal_tasks.inference.server.decode_step import DecodeSteps
from areal_tasks.inference.server.model_runner import ModelRunner, on_device
from areal_tasks.inference.server.prefill import Prefiller
from areal_tasks.inference.server.prefix_cache import PrefixCache
from areal_tasks.inference.server.readback import InflightStep, ReadbackBuffer
from areal_tasks.inference.server.request import FinishChecker, Sequence, check_prompt, finish_abort
from areal_tasks.inference.server.sampling import SamplingBatch, make_generator, sample
from areal_tasks.inference.server.stats import EngineCounters, EngineStats
from areal_tasks.inference.server.top_logprobs import attach, top_logprobs

logger = logging.getLogger(__name__)

#: an engine iteration (prefill plus one decode step) at least this long is logged with its sizes.
SLOW_ITERATION_S = 0.25
#: an idle engine's wait for the next request of a burst, and the longest it waits in all (module doc).
BURST_QUIET_S, BURST_MAX_WAIT_S = 0.001, 0.02
#: Retry-After of a refusal by the queue bound: sequences over the bound / recent finish rate,
#: within these seconds (the default when nothing finished lately, e.g. while paused).
RETRY_AFTER_MIN_S, RETRY_AFTER_MAX_S, RETRY_AFTER_DEFAULT_S = 1.0, 30.0, 5.0

T = TypeVar("T")
PauseMode = Literal["abort", "retract", "in_place"]


class Engine(DecodeSteps):
    """Continuous-batching generation over one :class:`ModelRunner` (see the module doc); its decode
    step is :class:`DecodeSteps`'s."""

    def __init__(
        self,
        runner: ModelRunner,
        weight_version: str = "0",
        max_prefill_tokens: int = 8192,
        overlap: bool = True,
        prefix_cache: bool = False,
        burst_quiet_s: float = BURST_QUIET_S,
    ) -> None:
        if not 0 <= burst_quiet_s <= BURST_MAX_WAIT_S:
            raise InferenceError(f"burst_quiet_s must be between 0 and {BURST_MAX_WAIT_S} s, got {burst_quiet_s}")
        self.runner = runner
        #: how long an idle engine waits for a burst's next request before admitting (module doc).
        self.burst_quiet_s = burst_quiet_s
        #: launch each decode step before reading back the previous one (``decode_step.py``).
        self.overlap = overlap
        self.weight_version = weight_version
        self.max_prefill_tokens = max_prefill_tokens
        self.finisher = FinishChecker(runner.tokenizer, runner.eos_token_ids, runner.max_len)
        self._cond = threading.Condition()
        self._waiting: collections.deque[Sequence] = collections.deque()
        self._controls: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self._running: list[Sequence] = []
        #: sequences whose last tokens are still on the device and whose length budget ends with
        #: them: no longer decoded (their slots are free), finished once those tokens are read.
        self._draining: list[Sequence] = []
        #: the decode step launched and not yet read back (overlap).
        self._inflight: InflightStep | None = None
        #: the rows of the last decode step and their sampling table (see _sampling_table).
        self._sampling_rows: tuple[list[Sequence], SamplingBatch | None] = ([], None)
        #: the rows of the last decode step launched, their slots and positions (``decode_step.py``).
        self._launched: list[Sequence] = []
        #: launches left before a row of the batch may exhaust its length budget (``decode_step.py``).
        self._exhaust_margin = 0
        self._readback = ReadbackBuffer(runner.cache.num_slots, runner.device)
        self._paused: PauseMode | None = None
        #: while gated (a weight update drains the engine), new sequences wait here, not in the queue.
        self._gated = False
        self._held: list[Sequence] = []
        #: sequences popped from the queue and being prefilled (counted as in flight).
        self._admitting = 0
        #: the queue bound of :meth:`submit` (None: unbounded).
        self.max_queued: int | None = None
        #: when the iteration in progress started (None while the loop waits for work).
        self._beat: float | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self.counters = EngineCounters()
        #: the prefix cache over the runner's KV slots (None: off).
        self.prefix_cache = PrefixCache(runner.cache) if prefix_cache else None
        if self.prefix_cache is None:
            runner.cache.attach(None)  # an earlier engine's retained entries are dropped
        self.prefiller = Prefiller(runner, self.counters, max_prefill_tokens, self._sample_and_check, self.prefix_cache)

    # ---------------- thread-safe API ----------------
    def start(self) -> None:
        if self._thread is not None:
            raise InferenceError("engine already started")
        self._thread = threading.Thread(target=self._loop, name="areal-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the loop thread runs and accepts work."""
        return self._thread is not None and self._thread.is_alive() and not self._stop

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop; unfinished sequences finish with ``abort``."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise InferenceError(f"engine loop did not stop within {timeout} s")

    def limit_queue(self, max_queued: int | None) -> None:
        """Bound the sequences running, waiting and held together (see the module doc)."""
        if max_queued is not None and max_queued < 1:
            raise InferenceError(f"max_queued must be >= 1, got {max_queued}")
        self.max_queued = max_queued

    def stalled_s(self) -> float:
        """Seconds the loop has spent in its current iteration (0 while it waits for work)."""
        beat = self._beat
        return 0.0 if beat is None else time.monotonic() - beat

    def submit(self, seqs: list[Sequence]) -> None:
        """Queue sequences for generation; each one's ``on_finish`` runs in the engine thread.

        Raises :class:`InferenceLimitError` (with ``retry_after_s``) when the queue bound leaves no
        room for all of them; none is queued then."""
        for seq in seqs:
            check_prompt(seq, self.runner.max_len, self.runner.vocab_size)
            self.finisher.prepare(seq)
            if seq.params.sampling_seed is not None and seq.generator is None:
                seq.generator = make_generator(seq.params.sampling_seed, self.runner.device)
        with self._cond:
            if self._stop:
                raise InferenceError("engine is shut down")
            if self.max_queued is not None:
                queued = self._queued()
                if queued + len(seqs) > self.max_queued:
                    raise InferenceLimitError(
                        f"the server's queue is full ({queued} of {self.max_queued} sequences queued or "
                        f"running; this request adds {len(seqs)}): try again later",
                        retry_after_s=self._retry_after_s(queued + len(seqs) - self.max_queued),
                    )
            (self._held if self._gated else self._waiting).extend(seqs)
            self._cond.notify_all()

    def _queued(self) -> int:
        """Sequences running, draining, being admitted, waiting or held (call with the lock held)."""
        return len(self._running) + len(self._draining) + self._admitting + len(self._waiting) + len(self._held)

    def _retry_after_s(self, excess: int) -> float:
        """Seconds until ``excess`` sequences have likely finished, at the recent finish rate."""
        rate = self.counters.finish_rate()
        wait = excess / rate if rate > 0 else RETRY_AFTER_DEFAULT_S
        return float(min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(wait))))

    def call(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn`` in the engine thread between two steps; the future carries its result or error."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._stop:
                raise InferenceError("engine is shut down")
            self._controls.append((fn, future))
            self._cond.notify_all()
        return future

    def stats(self) -> EngineStats:
        """A snapshot for ``/metrics`` (reads may race one step; every value is consistent alone)."""
        counters, cache = self.counters, self.runner.cache
        with self._cond:
            running, waiting = len(self._running) + len(self._draining), len(self._waiting) + len(self._held)
        return EngineStats(
            num_running=running,
            num_waiting=waiting,
            paused=self._paused,
            draining=self._gated,
            prompt_tokens_total=counters.prompt_tokens,
            generation_tokens_total=counters.generation_tokens,
            requests_finished_total=counters.requests_finished,
            gen_throughput=counters.throughput(),
            cache_used_tokens=cache.used_tokens,
            cache_capacity_tokens=cache.capacity_tokens,
            weight_version=self.weight_version,
            decode_steps_total=counters.decode_steps,
            decode_seconds_total=counters.decode_seconds,
            decode_wait_seconds_total=counters.decode_wait_seconds,
            prefill_batches_total=counters.prefill_batches,
            prefill_seconds_total=counters.prefill_seconds,
            cached_tokens_total=counters.cached_tokens,
            prefix_cache=self.prefix_cache is not None,
            prefix_cache_entries=0 if self.prefix_cache is None else self.prefix_cache.entries,
            prefix_cache_retained_tokens=cache.retained_tokens,
        )

    # ---------------- control operations (run inside the loop via call) ----------------
    def pause(self, mode: PauseMode) -> int:
        """Pause in ``mode``; returns how many sequences were aborted or retracted."""
        if mode not in ("abort", "retract", "in_place"):
            raise InferenceRequestError(f"pause mode must be abort, retract or in_place, got {mode!r}")
        self._paused = mode
        if mode == "abort":
            return self.abort_all("aborted by pause_generation")
        if mode == "retract":
            retracted = list(self._running)
            for seq in retracted:
                self.prefiller.release(seq)
                seq.retracted = True
                seq.num_retractions += 1
            self._running.clear()
            with self._cond:
                self._waiting.extendleft(reversed(retracted))
            return len(retracted)
        return 0

    def resume(self) -> None:
        self._paused = None

    def abort_all(self, message: str) -> int:
        """Finish every running and waiting sequence with ``abort`` and its partial output."""
        with self._cond:
            waiting = list(self._waiting)
            self._waiting.clear()
        victims = self._running + waiting
        self._running = []
        for seq in victims:
            self._finish(seq, finish_abort(message))
        return len(victims)

    def abort_rid(self, rid: str) -> int:
        """Abort the request ``rid``: the sequence of that rid and the ``<rid>_<j>`` samples (and
        ``<rid>_<i>_<j>`` prompts' samples of a batch) it was split into; nothing for ``""``. Not
        SGLang's bare prefix rule: ``/abort_request {}`` must not stop every other client's work."""
        if not rid:
            return 0
        split = re.compile(re.escape(rid) + r"(?:_\d+)+")
        return self.abort_where(
            lambda s: s.rid == rid or split.fullmatch(s.rid) is not None, "aborted by abort_request"
        )

    def abort_where(self, hit: Callable[[Sequence], bool], message: str) -> int:
        """Abort the running, waiting and held sequences for which ``hit`` is true, with their
        partial output (run inside the loop, through :meth:`call`)."""
        with self._cond:
            victims = [s for s in self._waiting if hit(s)] + [s for s in self._held if hit(s)]
            if victims:
                self._waiting = collections.deque(s for s in self._waiting if not hit(s))
                self._held = [s for s in self._held if not hit(s)]
        running = [s for s in self._running if hit(s)]
        if running:
            self._running = [s for s in self._running if not hit(s)]
        for seq in running + victims:
            self._finish(seq, finish_abort(message))
        return len(running) + len(victims)

    def weights_changed(self, new_version: str | None) -> None:
        """Call after the model's weights changed (every weight update does, each bucket of a
        collective one too): prompts prefilled under the old weights are no longer shared with
        siblings and the prefix cache forgets every entry; with ``new_version``, unfinished
        sequences note the old version's span (SGLang's ``weight_versions``) and the version
        changes."""
        dropped = self.prefiller.drop_cache()
        if dropped:
            logger.info("weights changed: %d prefix-cache entries dropped", dropped)
        with self._cond:
            waiting = list(self._waiting)
        for seq in waiting:
            seq.group.prompt_logits, seq.group.source_slot = None, None
        if new_version is None or new_version == self.weight_version:
            return
        for seq in self._running + waiting:
            if seq.output_ids:
                seq.version_events.append((self.weight_version, len(seq.output_ids)))
        self.weight_version = new_version

    def is_idle(self) -> bool:
        with self._cond:
            return not self._running and not self._draining and not self._waiting

    @property
    def paused(self) -> PauseMode | None:
        return self._paused

    def set_gate(self, gated: bool) -> None:
        """Hold new sequences back (SGLang's weight-update writer lock) or let the held ones in."""
        with self._cond:
            self._gated = gated
            if not gated:
                self._waiting.extend(self._held)
                self._held.clear()
            self._cond.notify_all()

    def in_flight(self) -> int:
        """Running and queued sequences, not counting those held back by the gate."""
        with self._cond:
            return len(self._running) + len(self._draining) + len(self._waiting) + self._admitting

    def holds_kv(self) -> bool:
        """Whether scheduled sequences hold KV computed earlier (running, retracted, or queued while not
        paused): SGLang refuses to flush its cache then, and so fails a weight update with flush_cache."""
        with self._cond:
            queued = any(s.retracted for s in self._waiting) or (self._paused is None and bool(self._waiting))
            return bool(self._running or self._draining) or queued

    # ---------------- the loop ----------------
    def _has_work(self) -> bool:
        if self._controls or self._stop or self._inflight is not None:
            return True
        return self._paused is None and bool(self._running or self._waiting)

    def _loop(self) -> None:
        logger.info("engine loop started")
        with torch.inference_mode(), on_device(self.runner.device):
            self._run()
        logger.info("engine loop stopped")

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._has_work():
                    self._beat = None
                    while not self._has_work():
                        self._cond.wait()
                self._beat = time.monotonic()
                stopping = self._stop
                controls: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
                if not stopping:  # on stop they stay queued and are refused below
                    controls = list(self._controls)
                    self._controls.clear()
            if controls or stopping:
                # controls see every sampled token, under the weights that produced it
                self._guard_decode(self._collect)
            if stopping:
                break
            for fn, future in controls:
                self._run_control(fn, future)
            if self._paused is None:
                self._settle_burst()
                started = time.perf_counter()
                admitted = self._admit()
                prefilled = time.perf_counter()
                if admitted[0]:
                    self.counters.add_prefill(prefilled - started)
                self._guard_decode(self._decode_step)
                self._note_slow_iteration(started, prefilled, admitted)
            else:
                self._guard_decode(self._collect)
        self.set_gate(False)
        self.abort_all("server shutting down")
        with self._cond:
            controls = list(self._controls)
            self._controls.clear()
        for _, future in controls:
            future.set_exception(InferenceError("engine is shut down"))

    def _guard_decode(self, step: Callable[[], None]) -> None:
        """Run a decode step (or the read-back of one); if it fails, the running batch finishes with
        an ``abort`` carrying status 500 and the engine goes on."""
        try:
            step()
        except Exception as exc:
            logger.exception("decode step failed; aborting the running batch")
            try:
                self._collect()  # a step launched before the failure still holds valid tokens
            except Exception:
                logger.exception("reading back the step in flight failed too; its tokens are lost")
            failed = self._running + self._draining
            self._running, self._draining = [], []
            self.prefiller.drop_cache()  # a failed step may have left partial KV behind
            for seq in failed:
                seq.pending_tokens = 0
                if seq.finished:  # finished by the step read back just before the failure
                    self._release(seq)
                else:
                    self._finish(seq, finish_abort(f"decode failed: {type(exc).__name__}: {exc}", status_code=500))

    @staticmethod
    def _run_control(fn: Callable[[], Any], future: concurrent.futures.Future) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)

    def _note_slow_iteration(self, started: float, prefilled: float, admitted: tuple[int, int]) -> None:
        """Log an iteration longer than :data:`SLOW_ITERATION_S`: a pause or weight update waits
        for the iteration in progress, so these explain a slow pause."""
        took = time.perf_counter() - started
        if took >= SLOW_ITERATION_S:
            logger.info(
                "slow engine iteration: %.0f ms (prefill of %d sequences, %d tokens: %.0f ms; decode of %d)",
                1e3 * took,
                admitted[0],
                admitted[1],
                1e3 * (prefilled - started),
                len(self._running),
            )

    def _settle_burst(self) -> None:
        """On an idle engine with requests waiting, wait until the burst they came in stops growing
        (no arrival for :attr:`burst_quiet_s`), the queue fills the free slots, a control call or a
        stop arrives, or :data:`BURST_MAX_WAIT_S` passes (see the module doc)."""
        if self.burst_quiet_s <= 0 or self._running or self._draining or self._inflight is not None:
            return
        free = self.runner.cache.free_slots
        deadline = time.monotonic() + BURST_MAX_WAIT_S
        with self._cond:
            seen = len(self._waiting)
            while 0 < seen < free and not (self._controls or self._stop):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(self.burst_quiet_s, left))
                if len(self._waiting) == seen:  # quiet for burst_quiet_s (or woken by a control)
                    return
                seen = len(self._waiting)

    def _admit(self) -> tuple[int, int]:
        """Pop as many queued sequences as free slots and the prefill budget allow, and prefill them;
        returns how many sequences and prompt tokens were prefilled."""
        free, budget, seqs = self.runner.cache.free_slots, self.max_prefill_tokens, []
        with self._cond:
            while self._waiting and len(seqs) < free and budget > 0:
                seq = self._waiting.popleft()
                budget -= len(seq.prompt_ids) + (len(seq.output_ids) if seq.retracted else 0)
                seqs.append(seq)
            self._admitting = len(seqs)
        if not seqs:
            return 0, 0
        tokens = self.max_prefill_tokens - budget
        self.prefiller.admit(seqs)
        # admitted rows took a token outside a decode step (even rows the batch had before, retracted
        # and admitted again): the next step checks every row's length budget (decode_step.py)
        self._exhaust_margin = 0
        for seq in seqs:
            if seq.finished:
                self._release(seq)
            else:
                self._running.append(seq)
        with self._cond:
            self._admitting = 0
        return len(seqs), tokens

    def _sample_and_check(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Sample one token per sequence from ``logits`` and read it back now (admission prefills)."""
        batch = SamplingBatch.build(
            [s.params for s in seqs], [s.generator for s in seqs], logits.device, [s.top_logprobs_num for s in seqs]
        )
        tokens, logprobs = sample(logits, batch, self.runner.greedy)
        logprobs, top = top_logprobs(logits, batch, tokens, logprobs)
        # one device-to-host copy: token ids (< 2**53) travel exactly as float64
        token_list, logprob_list = torch.stack((tokens.double(), logprobs.double())).tolist()
        self.counters.add_generated(len(seqs))
        for seq, token, logprob in zip(seqs, token_list, logprob_list):
            self._append(seq, int(token), logprob)
        if batch.top is not None and top is not None:
            attach(seqs, batch.top, top.tolist())

    def _append(self, seq: Sequence, token: int, logprob: float) -> None:
        seq.append(token, logprob)
        reason = self.finisher.check(seq)
        if reason is not None:
            seq.finish_reason = reason

    def _release(self, seq: Sequence) -> None:
        """Retire a sequence that finished during a step."""
        self.prefiller.release(seq)
        self._deliver(seq)

    def _finish(self, seq: Sequence, reason: dict) -> None:
        """Finish ``seq`` from outside a step (abort); its partial output is kept."""
        seq.finish_reason = reason
        self.prefiller.release(seq)
        self._deliver(seq)

    def _deliver(self, seq: Sequence) -> None:
        seq.finished_at = time.perf_counter()
        seq.finish_version = self.weight_version
        self.counters.add_finished()
        try:
            seq.on_finish(seq)
        except Exception:
            logger.exception("on_finish callback of request %s failed", seq.rid)
