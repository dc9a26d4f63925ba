"""Admission of queued sequences: give each one KV in a slot and its first token.

Fresh prompts are prefilled together, sorted by length, in forwards of at most
``max_prefill_tokens`` padded tokens and a few distinct lengths (logits are computed only at the
distinct last positions). Other sequences go one at a time:

* a sibling of an ``n > 1`` request samples its first token from the prompt logits its group keeps
  and copies the prompt's KV from a live sibling (or prefills it again when none is left);
* a sequence retracted by a ``retract`` pause prefills its prompt plus its output so far;
* a prompt with images (``SequenceGroup.vision``) runs the vision tower in its own prefill;
* a request that wants prompt logprobs (``logprob_start_len >= 0``) gets all prompt logits (and,
  with ``top_logprobs_num``, each prompt position's most likely alternatives, SGLang's
  ``input_top_logprobs``: raw logits, like the prompt logprobs).

A failure inside a prefill finishes the sequences involved with an ``abort`` carrying status 500
(their slots freed); the engine keeps running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from areal_tasks.inference.server.kv_cache import SlotKVCache
from areal_tasks.inference.server.model_runner import ModelRunner
from areal_tasks.inference.server.request import Sequence, finish_abort, finish_length
from areal_tasks.inference.server.stats import EngineCounters
from areal_tasks.inference.server.top_logprobs import TopEntry

logger = logging.getLogger(__name__)

#: distinct prompt lengths per batched prefill (each one costs a row of logits per prompt).
MAX_DISTINCT_LENGTHS = 4


def release_slot(cache: SlotKVCache, seq: Sequence) -> None:
    """Free ``seq``'s slot (and stop sharing it as its group's prompt source)."""
    if seq.slot is None:
        return
    if seq.group.source_slot == seq.slot:
        seq.group.source_slot = None
    cache.release(seq.slot)
    seq.slot = None


def _share_prompt(seq: Sequence, logits: torch.Tensor) -> None:
    """Keep the prompt's logits and KV source for the siblings of an ``n > 1`` request."""
    if seq.params.n > 1:
        seq.group.source_slot, seq.group.prompt_logits = seq.slot, logits.clone()


def _prompt_top(logprobs: torch.Tensor, k: int) -> list[TopEntry | None]:
    """The ``k`` most likely tokens at each prompt position after the first (first position: None)."""
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    rows = zip(ids.tolist(), values.tolist())
    return [None, *([(int(t), v) for t, v in zip(row_ids, row_values)] for row_ids, row_values in rows)]


def _wants_prompt_logprobs(seq: Sequence) -> bool:
    return seq.return_logprob and 0 <= seq.logprob_start_len < len(seq.prompt_ids)


class Prefiller:
    """Runs the admission prefills of the engine loop (see the module doc)."""

    def __init__(
        self,
        runner: ModelRunner,
        counters: EngineCounters,
        max_prefill_tokens: int,
        sample_and_check: Callable[[list[Sequence], torch.Tensor], None],
    ) -> None:
        self.runner = runner
        self.cache = runner.cache
        self.counters = counters
        self.max_prefill_tokens = max_prefill_tokens
        self.sample_and_check = sample_and_check

    def admit(self, seqs: list[Sequence]) -> None:
        """Prefill ``seqs``; afterwards each one holds a slot and a first token, or is finished."""
        fresh, others, groups = [], [], set()
        for seq in seqs:
            batchable = (
                not seq.retracted
                and seq.group.prompt_logits is None
                and seq.group.vision is None
                and seq.params.max_new_tokens > 0
                and not _wants_prompt_logprobs(seq)
            )
            if batchable and id(seq.group) not in groups:
                fresh.append(seq)
                groups.add(id(seq.group))
            else:
                others.append(seq)
        for chunk in self._chunks(fresh):
            self._guard(chunk, self._prefill_fresh)
        for seq in others:
            self._guard([seq], self._prefill_one)

    def _chunks(self, seqs: list[Sequence]) -> list[list[Sequence]]:
        chunks: list[list[Sequence]] = []
        current: list[Sequence] = []
        for seq in sorted(seqs, key=lambda s: len(s.prompt_ids)):
            grown = [*current, seq]
            distinct = len({len(s.prompt_ids) for s in grown})
            if current and (
                len(grown) * len(seq.prompt_ids) > self.max_prefill_tokens or distinct > MAX_DISTINCT_LENGTHS
            ):
                chunks.append(current)
                grown = [seq]
            current = grown
        return chunks + ([current] if current else [])

    def _guard(self, seqs: list[Sequence], prefill: Callable[[list[Sequence]], None]) -> None:
        try:
            prefill(seqs)
        except Exception as exc:
            logger.exception("prefill of %s failed", [s.rid for s in seqs])
            for seq in seqs:
                release_slot(self.cache, seq)
                if seq.finish_reason is None:
                    seq.finish_reason = finish_abort(f"prefill failed: {type(exc).__name__}: {exc}", status_code=500)

    def _prefill_fresh(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.slot = self.cache.allocate()
        logits = self.runner.prefill_batch([s.slot for s in seqs], [s.prompt_ids for s in seqs])
        self.counters.add_prompt_tokens(sum(len(s.prompt_ids) for s in seqs))
        for seq, row in zip(seqs, logits):
            _share_prompt(seq, row)
        self.sample_and_check(seqs, logits)

    def _prefill_one(self, seqs: list[Sequence]) -> None:
        (seq,) = seqs
        group = seq.group
        if seq.retracted:
            tokens = group.prompt_ids + seq.output_ids
            seq.slot = self.cache.allocate()
            logits = self.runner.prefill(seq.slot, tokens, vision=group.vision)[-1]
            seq.retracted = False
            self.counters.add_prompt_tokens(len(tokens))
            self.sample_and_check([seq], logits.view(1, -1))
        elif group.prompt_logits is None:
            self._prefill_prompt(seq)
        else:
            self.sample_and_check([seq], group.prompt_logits.view(1, -1))
            if seq.finished:
                return
            seq.slot = self.cache.allocate()
            if group.source_slot is not None:
                self.cache.copy_prefix(group.source_slot, seq.slot, len(group.prompt_ids))
                return
            self.runner.prefill(seq.slot, group.prompt_ids, vision=group.vision)
            group.source_slot = seq.slot
            self.counters.add_prompt_tokens(len(group.prompt_ids))

    def _prefill_prompt(self, seq: Sequence) -> None:
        """A single prompt prefill (prompt logprobs, or ``max_new_tokens`` 0)."""
        group = seq.group
        want_input = _wants_prompt_logprobs(seq)
        if seq.params.max_new_tokens == 0 and not want_input:
            seq.finish_reason = finish_length(0)
            return
        seq.slot = self.cache.allocate()
        logits = self.runner.prefill(seq.slot, group.prompt_ids, all_logits=want_input, vision=group.vision)
        self.counters.add_prompt_tokens(len(group.prompt_ids))
        if want_input:
            logprobs = torch.log_softmax(logits[:-1], dim=-1)
            targets = torch.tensor(group.prompt_ids[1:], device=logits.device).view(-1, 1)
            values: list[float | None] = [None, *logprobs.gather(1, targets).view(-1).tolist()]
            group.input_logprobs = values[seq.logprob_start_len :]
            if seq.top_logprobs_num > 0:
                group.input_top_logprobs = _prompt_top(logprobs, seq.top_logprobs_num)[seq.logprob_start_len :]
        if seq.params.max_new_tokens == 0:
            seq.finish_reason = finish_length(0)
            return
        _share_prompt(seq, logits[-1])
        self.sample_and_check([seq], logits[-1].view(1, -1))
