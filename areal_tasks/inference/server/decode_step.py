"""The engine's decode step: compact the running batch, launch one decode forward, sample on the
device, and read back the step launched before it.

**Overlap** (on by default; SGLang's overlap scheduler, ``overlap=False`` for its
``--disable-overlap-schedule``): a step's sampled tokens stay on the device as the next step's
inputs, and the host reads them back one step late (``readback.py``). Each iteration launches
step N+1 first and only then extends the outputs and checks the finish rules of step N, so the
host's per-token work runs while the device computes instead of between device steps. A sequence
that stops at step N (EOS, a stop string) has already been launched in step N+1: that one token is
computed and dropped. A sequence whose length budget ends with its unread tokens is not launched
again (its slot is freed at once) and finishes when they are read.

**Steady steps.** Most steps decode the same rows as the step before (no admission, finish or
abort in between): then every row's input is its unread token at its own row of the step in flight,
its position is one past its last one, compaction has nothing to move, the sampling table is the
same, and no row can have exhausted its length budget before the margin counted at the last full
check runs out. Such a step skips those per-row passes (``engine_host_overhead.py`` measures them)
and asks the runner to decode the same rows again (``ModelRunner.decode_again``): the CUDA-graph
runner then advances its device inputs in place instead of staging them from the host.

:class:`DecodeSteps` is a mixin of :class:`~areal_tasks.inference.server.engine.Engine`: its
methods run in the engine thread and work on the engine's state, declared below.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable

import torch

from areal_tasks.api.faults import fault_point
from areal_tasks.inference.server.model_runner import ModelRunner
from areal_tasks.inference.server.prefill import Prefiller
from areal_tasks.inference.server.prefix_cache import PrefixCache
from areal_tasks.inference.server.readback import InflightStep, ReadbackBuffer
from areal_tasks.inference.server.request import FinishChecker, Sequence
from areal_tasks.inference.server.sampling import SamplingBatch, sample
from areal_tasks.inference.server.stats import EngineCounters
from areal_tasks.inference.server.top_logprobs import attach, top_logprobs


class DecodeSteps:
    """The decode step of :class:`~areal_tasks.inference.server.engine.Engine` (see the module doc)."""

    # the engine's state these methods use (set in Engine.__init__)
    runner: ModelRunner
    overlap: bool
    weight_version: str
    finisher: FinishChecker
    counters: EngineCounters
    prefiller: Prefiller
    prefix_cache: PrefixCache | None
    _running: list[Sequence]
    _draining: list[Sequence]
    _inflight: InflightStep | None
    _sampling_rows: tuple[list[Sequence], SamplingBatch | None]
    #: the rows of the last decode step launched (``_launch``).
    _launched: list[Sequence]
    #: steps the launched rows can take before one may exhaust its length budget (``_set_aside_exhausted``).
    _exhaust_margin: int
    _readback: ReadbackBuffer
    #: retires a finished sequence (Engine._release)
    _release: Callable[[Sequence], None]

    def _compact(self) -> None:
        """Move running sequences into slots ``0..B-1`` (highest first into the lowest holes), so a
        decode step reads one contiguous block of the cache; rows are then ordered by slot."""
        cache, count = self.runner.cache, len(self._running)
        movers = sorted((s for s in self._running if s.slot >= count), key=lambda s: -s.slot)
        if movers:  # most steps have none: no pass over the free slots (768 of them at 256 of 1,024)
            holes = sorted(slot for slot in cache.free_slot_ids() if slot < count)
            moves = []
            for seq, hole in zip(movers, holes):
                if seq.group.source_slot == seq.slot:
                    seq.group.source_slot = hole
                moves.append((seq.slot, hole))
                seq.slot = hole
            cache.move_many(moves)  # all of a step's moves in one copy per layer
        self._running.sort(key=lambda s: s.slot)

    def _decode_step(self) -> None:
        """Launch a decode step of the running sequences; then read back the step launched before it
        (overlap) or this one (no overlap)."""
        started = time.perf_counter()
        self._set_aside_exhausted()
        if not self._running:
            self._collect()
            return
        batch, logits = self._launch()
        fault_point("server.decode", version=self.weight_version)  # the fault tests' (a no-op unless set)
        sampling = self._sampling_table(batch, logits.device)
        # queued behind the forward: sampling never syncs
        tokens, logprobs = sample(logits, sampling, self.runner.greedy)
        logprobs, top = top_logprobs(logits, sampling, tokens, logprobs)
        launched = self._readback.start(batch, tokens, logprobs, sampling.top, top)
        # the host's work on the previous step runs while the device computes this one
        waited = self._collect()
        self._inflight = launched
        if not self.overlap:
            waited += self._collect()
        self.counters.add_decode_step(time.perf_counter() - started, waited)

    def _sampling_table(self, batch: list[Sequence], device: torch.device) -> SamplingBatch:
        """The sampling settings of ``batch``'s rows, rebuilt only when its rows changed (each
        build is a host-to-device copy; a batch keeps its rows for many steps)."""
        rows, table = self._sampling_rows
        if table is None or rows != batch:  # row by row, by identity (Sequence's eq)
            table = SamplingBatch.build(
                [s.params for s in batch], [s.generator for s in batch], device, [s.top_logprobs_num for s in batch]
            )
            self._sampling_rows = (batch, table)
        return table

    def _set_aside_exhausted(self) -> None:
        """Stop decoding sequences whose length budget ends with their unread tokens (see the module
        doc): they move to the draining list and their slots are freed for the step to come. The
        budget is ``length_cap`` (``FinishChecker.prepare``: ``max_new_tokens``, or the context
        left after the prompt, whichever is less). Each launch brings every row one token nearer
        its budget, so while the rows stay those launched last, a margin counted at the last pass
        over them says when the next pass is due (an admission sets it to 0: its prefill gave rows
        a token outside a step, even rows launched before, retracted and admitted again)."""
        if self._exhaust_margin > 0 and self._running == self._launched:
            return
        margin, exhausted = 1 << 62, []
        for seq in self._running:
            left = seq.length_cap - len(seq.output_ids) - seq.pending_tokens
            if left <= 0 and seq.pending_tokens:
                exhausted.append(seq)
            elif left < margin:
                margin = left
        self._exhaust_margin = margin
        if not exhausted:
            return
        for seq in exhausted:
            self.prefiller.release(seq)
            self._draining.append(seq)
        gone = {id(s) for s in exhausted}
        self._running = [s for s in self._running if id(s) not in gone]

    def _launch(self) -> tuple[list[Sequence], torch.Tensor]:
        """Queue one decode forward of every running sequence; returns the rows and their logits. A
        row with an unread token (it was in the step in flight) takes it from that step's device
        tensor."""
        previous = self._inflight
        self._exhaust_margin -= 1
        if previous is not None and previous.seqs == self._running:  # a steady step (module doc)
            batch = list(self._running)
            for seq in batch:
                seq.pending_tokens += 1
            self._spare_padding(len(batch))
            self._launched = batch
            return batch, self.runner.decode_again(previous.tokens)
        self._compact()
        batch = list(self._running)
        tokens, rows, positions = [], [], []
        for row, seq in enumerate(batch):
            output = seq.output_ids
            if seq.pending_tokens:  # its last token is in the step in flight, at seq.step_row
                tokens.append(0)
                rows.append(seq.step_row)
            else:
                tokens.append(output[-1])
                rows.append(-1)
            positions.append(len(seq.group.prompt_ids) + len(output) + seq.pending_tokens - 1)
            seq.pending_tokens += 1
            seq.step_row = row
        return batch, self._decode(batch, [s.slot for s in batch], tokens, positions, rows)

    def _decode(
        self, batch: list[Sequence], slots: list[int], tokens: list[int], positions: list[int], rows: list[int]
    ) -> torch.Tensor:
        """Queue the decode forward of ``batch`` (in ``slots``); a row with ``rows[i] >= 0`` takes
        its input from that row of the step in flight, the others ``tokens[i]``."""
        previous = self._inflight
        carried = previous is not None and max(rows) >= 0
        self._spare_padding(len(batch))
        self._launched = batch
        return self.runner.decode(
            slots,
            tokens,
            positions,
            previous.tokens if carried and previous is not None else None,
            rows if carried else None,
            **({"rope_deltas": [s.rope_delta for s in batch]} if self.runner.is_vision else {}),
        )

    def _spare_padding(self, count: int) -> None:
        """Move away (or drop, without room) the retained prefix-cache entries in the free slots
        a padded captured decode step of ``count`` rows (slots ``0..count-1``) writes position 0
        of (``cuda_graph.py``)."""
        buckets = getattr(self.runner, "buckets", None)
        cache = self.runner.cache
        if self.prefix_cache is None or not buckets or count > buckets[-1] or not cache.retained_slots:
            return
        padded = buckets[bisect.bisect_left(buckets, count)]
        cache.evacuate([s for s in cache.retained_slots if count <= s < padded], padded)

    def _collect(self) -> float:
        """Read back the step in flight, if any: extend outputs, check finish rules, retire the
        sequences that finished (a token of a sequence that stopped a step earlier is dropped).
        Returns the seconds spent waiting for the device."""
        step, self._inflight = self._inflight, None
        if step is None:
            return 0.0
        token_list, logprob_list = step.results()
        stale, finished, check = 0, False, self.finisher.check
        # the hot loop of a decode step (every running sequence, every step): Sequence.append and
        # the finish rules inlined, and the full check only where a rule can apply (prepare());
        # every sequence has its first token (and first_token_at) from its admission's prefill
        for seq, token, logprob in zip(step.seqs, token_list, logprob_list):
            seq.pending_tokens -= 1
            if seq.finish_reason is not None:
                stale += 1
                continue
            output = seq.output_ids
            output.append(token)
            seq.output_logprobs.append(logprob)
            if seq.watch_text or token in seq.stop_ids or len(output) >= seq.length_cap:
                reason = check(seq)
                if reason is not None:
                    seq.finish_reason, finished = reason, True
        if step.top is not None:
            attach(step.seqs, step.top, step.top_results())
        self.counters.add_generated(len(step.seqs) - stale)
        self._retire_finished(finished)
        return step.waited

    def _retire_finished(self, finished: bool) -> None:
        """Release the running or draining sequences that have finished (``finished``: some running
        one did, in the step just read back); draining ones without unread tokens have finished by
        now (their length budget ended)."""
        if finished:
            still = []
            for seq in self._running:
                if seq.finished:
                    self._release(seq)
                else:
                    still.append(seq)
            self._running = still
        if self._draining:
            waiting = [s for s in self._draining if s.pending_tokens]
            for seq in self._draining:
                if not seq.pending_tokens:
                    self._release(seq)
            self._draining = waiting
