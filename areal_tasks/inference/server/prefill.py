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

With the **prefix cache** (``prefix_cache.py``; the engine's default) a text prompt first looks for
cached KV: a prompt equal to one prefilled before (a GRPO group's samples sent as separate
requests, in the same admission or later, while that KV is kept) copies its KV and samples from
the logits kept with it, with no forward; a prompt that extends a cached sequence (a later turn:
the earlier prompt, its output, new tokens) or shares whole blocks with one copies the matched
positions and prefills only the rest, from there. Identical prompts admitted together are
prefilled once. The rest are prefilled together as above. Prompts with images and prompts that
want prompt logprobs (all their logits) are not looked up; the KV of every text sequence is kept
when it leaves its slot (finished, aborted, retracted), except after a failed prefill.

A failure inside a prefill finishes the sequences involved with an ``abort`` carrying status 500
(their slots freed, their KV not kept); the engine keeps running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from areal_tasks.inference.server.model_runner import ModelRunner
from areal_tasks.inference.server.prefix_cache import PrefixCache, PrefixMatch
from areal_tasks.inference.server.request import Sequence, finish_abort, finish_length
from areal_tasks.inference.server.stats import EngineCounters
from areal_tasks.inference.server.top_logprobs import TopEntry

logger = logging.getLogger(__name__)

#: distinct prompt lengths per batched prefill (each one costs a row of logits per prompt).
MAX_DISTINCT_LENGTHS = 4


def _share_prompt(seq: Sequence, logits: torch.Tensor) -> None:
    """Keep the prompt's logits (a tensor of its own, never written) and KV source for the
    siblings of an ``n > 1`` request."""
    if seq.params.n > 1:
        seq.group.source_slot, seq.group.prompt_logits = seq.slot, logits


def _prompt_top(logprobs: torch.Tensor, k: int) -> list[TopEntry | None]:
    """The ``k`` most likely tokens at each prompt position after the first (first position: None)."""
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    rows = zip(ids.tolist(), values.tolist())
    return [None, *([(int(t), v) for t, v in zip(row_ids, row_values)] for row_ids, row_values in rows)]


def _wants_prompt_logprobs(seq: Sequence) -> bool:
    return seq.return_logprob and 0 <= seq.logprob_start_len < len(seq.prompt_ids)


class Prefiller:
    """Runs the admission prefills of the engine loop (see the module doc); ``prefix``: the
    prefix cache over the runner's KV cache (None: off)."""

    def __init__(
        self,
        runner: ModelRunner,
        counters: EngineCounters,
        max_prefill_tokens: int,
        sample_and_check: Callable[[list[Sequence], torch.Tensor], None],
        prefix: PrefixCache | None = None,
    ) -> None:
        self.runner = runner
        self.cache = runner.cache
        self.counters = counters
        self.max_prefill_tokens = max_prefill_tokens
        self.sample_and_check = sample_and_check
        self.prefix = prefix

    # ---- slots ----
    def release(self, seq: Sequence, keep: bool = True) -> None:
        """Free ``seq``'s slot (and stop sharing it as its group's prompt source). With the prefix
        cache and ``keep``, a text sequence's KV stays cached (its prompt and output so far)."""
        slot = seq.slot
        if slot is None:
            return
        if seq.group.source_slot == slot:
            seq.group.source_slot = None
        seq.slot = None
        if self.prefix is None:
            self.cache.release(slot)
            return
        self.prefix.release(slot, [*seq.prompt_ids, *seq.output_ids] if keep and self._shareable(seq) else None)

    def drop_cache(self) -> int:
        """Forget every prefix-cache entry (the weights changed, or a step failed); returns how many."""
        return 0 if self.prefix is None else self.prefix.invalidate()

    def _shareable(self, seq: Sequence) -> bool:
        """Whether ``seq``'s KV may be looked up and kept: a text prompt, with the prefix cache on."""
        return self.prefix is not None and seq.group.vision is None

    def _count(self, seq: Sequence, prefilled: int, cached: int) -> None:
        self.counters.add_prompt_tokens(prefilled, cached)
        seq.cached_tokens += cached

    # ---- admission ----
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
        fresh, cached = self._split_cached(fresh)
        for chunk in self._chunks(fresh):
            self._guard(chunk, self._prefill_fresh)
        if cached:
            self._prefill_cached(cached)
        siblings = [s for s in others if not s.retracted and s.group.prompt_logits is not None]
        if siblings:
            self._guard(siblings, self._admit_siblings)
        for seq in others:
            if seq.slot is None and seq.finish_reason is None:
                self._guard([seq], self._prefill_one)

    def _split_cached(self, seqs: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
        """``(to prefill together, to serve from the prefix cache)``: a prompt with cached KV, or
        equal to one prefilled together now, goes to the cache (after those prefills)."""
        if self.prefix is None:
            return seqs, []
        fresh, cached, seen = [], [], set()
        for seq in seqs:
            prompt = seq.prompt_ids
            key = tuple(prompt)
            if key in seen or self.prefix.exact(prompt) is not None or self.prefix.lookup(prompt, len(prompt) - 1):
                cached.append(seq)
            else:
                seen.add(key)
                fresh.append(seq)
        return fresh, cached

    def _chunks(self, seqs: list[Sequence]) -> list[list[Sequence]]:
        """``seqs`` by prompt length into prefill batches: at most ``max_prefill_tokens`` padded
        tokens (rows x the longest) and :data:`MAX_DISTINCT_LENGTHS` lengths each (one pass)."""
        chunks: list[list[Sequence]] = []
        current: list[Sequence] = []
        distinct, last = 0, -1
        for length, seq in sorted(((len(s.prompt_ids), s) for s in seqs), key=lambda pair: pair[0]):
            grows = distinct + (length != last)  # sorted: a new length is never one seen before
            if current and ((len(current) + 1) * length > self.max_prefill_tokens or grows > MAX_DISTINCT_LENGTHS):
                chunks.append(current)
                current, grows = [], 1
            current.append(seq)
            distinct, last = grows, length
        return chunks + ([current] if current else [])

    def _guard(self, seqs: list[Sequence], prefill: Callable[[list[Sequence]], None]) -> None:
        try:
            prefill(seqs)
        except Exception as exc:
            logger.exception("prefill of %s failed", [s.rid for s in seqs])
            self._fail(seqs, exc)

    def _fail(self, seqs: list[Sequence], exc: Exception) -> None:
        """Finish ``seqs`` with a 500 abort for ``exc``; their slots are freed, their KV not kept."""
        for seq in seqs:
            self.release(seq, keep=False)
            if seq.finish_reason is None:
                seq.finish_reason = finish_abort(f"prefill failed: {type(exc).__name__}: {exc}", status_code=500)

    def _prefill_fresh(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.slot = self.cache.allocate()
        logits = self.runner.prefill_batch([s.slot for s in seqs], [s.prompt_ids for s in seqs])
        self._count_all(seqs)
        for seq, row in zip(seqs, logits):
            self._keep(seq, seq.prompt_ids, row)
        self.sample_and_check(seqs, logits)

    def _count_all(self, seqs: list[Sequence]) -> None:
        self.counters.add_prompt_tokens(sum(len(s.prompt_ids) for s in seqs))

    def _keep(self, seq: Sequence, tokens: list[int], logits: torch.Tensor) -> None:
        """``seq`` now holds ``tokens``' KV, followed by ``logits`` [V] (a row of a forward's
        logits): a copy is shared with its ``n > 1`` siblings and, for a text prompt, entered in
        the prefix cache with the slot."""
        shareable = self._shareable(seq)
        if seq.params.n == 1 and not shareable:
            return
        owned = logits.clone()
        _share_prompt(seq, owned)
        if self.prefix is not None and shareable and seq.slot is not None:
            self.prefix.register(seq.slot, tokens, owned)

    def _prefill_cached(self, seqs: list[Sequence]) -> None:
        """Give each of ``seqs`` its prompt's KV from the prefix cache (prefilling what is not
        cached), then sample their first tokens together."""
        ready: list[Sequence] = []
        rows: list[torch.Tensor] = []
        if not self.runner.is_vision:  # text: the uncached rests of all of them in one forward
            seqs = self._prefill_rests(seqs, ready, rows)
        for seq in seqs:
            try:
                rows.append(self._cached_prefill(seq, seq.prompt_ids))
            except Exception as exc:
                logger.exception("prefill of %s failed", seq.rid)
                self._fail([seq], exc)
                continue
            _share_prompt(seq, rows[-1])
            ready.append(seq)
        if ready:
            self._guard(ready, lambda batch: self.sample_and_check(batch, torch.stack(rows)))

    def _prefill_rests(self, seqs: list[Sequence], ready: list[Sequence], rows: list[torch.Tensor]) -> list[Sequence]:
        """Serve text ``seqs`` from the prefix cache with at most one forward: each takes a slot
        holding its cached prefix (a prompt cached with its logits needs nothing more), then the
        uncached rests of all of them are prefilled together, each from its own start. One forward
        each was launch-bound on a GPU: a tenth of the batched prefill's throughput.

        Every entry this admission reads is marked used first, so the slots it takes evict other
        entries: taking slots one by one used to evict the entries of the batch's later prompts,
        each of which then needed a whole prefill of its own. Appends the served sequences and their
        logits to ``ready``/``rows``; returns none left (the signature keeps the caller's loop)."""
        assert self.prefix is not None
        for seq in seqs:
            entry = self.prefix.exact(seq.prompt_ids)
            if entry is None:
                match = self.prefix.lookup(seq.prompt_ids, len(seq.prompt_ids) - 1)
                entry = match.entry if match is not None else None
            if entry is not None and not entry.live:
                self.cache.touch(entry.slot)
        batch: list[tuple[Sequence, int]] = []
        for seq in seqs:
            tokens = seq.prompt_ids
            try:
                entry = self.prefix.exact(tokens)
                if entry is not None and entry.logits is not None:
                    logits = entry.logits
                    seq.slot, length = self.prefix.acquire(PrefixMatch(entry, len(tokens)))
                    if length == len(tokens):  # the prompt and its logits: no forward
                        self._count(seq, 0, length)
                        self.prefix.register(seq.slot, tokens, logits)
                        _share_prompt(seq, logits)
                        ready.append(seq)
                        rows.append(logits)
                        continue
                else:
                    match = self.prefix.lookup(tokens, len(tokens) - 1)
                    seq.slot, length = self.prefix.acquire(match) if match is not None else (self.cache.allocate(), 0)
            except Exception as exc:
                logger.exception("prefill of %s failed", seq.rid)
                self._fail([seq], exc)
                continue
            batch.append((seq, length))
        if not batch:
            return []
        members = [seq for seq, _ in batch]
        try:
            logits = self.runner.prefill_from(
                [seq.slot for seq in members],
                [seq.prompt_ids[length:] for seq, length in batch],
                [length for _, length in batch],
            )
        except Exception as exc:
            logger.exception("prefill of %d sequences after cached prefixes failed", len(members))
            self._fail(members, exc)
            return []
        for (seq, length), row in zip(batch, logits):
            self._count(seq, len(seq.prompt_ids) - length, length)
            self.prefix.register(seq.slot, seq.prompt_ids, row)
            _share_prompt(seq, row)
            ready.append(seq)
            rows.append(row)
        return []

    def _cached_prefill(self, seq: Sequence, tokens: list[int]) -> torch.Tensor:
        """Give ``seq`` a slot holding ``tokens``' KV, reusing the longest cached prefix, and
        return the logits [V] after ``tokens`` (those kept with an equal prompt, or the prefill's)."""
        assert self.prefix is not None
        entry = self.prefix.exact(tokens)
        if entry is not None and entry.logits is not None:
            seq.slot, length = self.prefix.acquire(PrefixMatch(entry, len(tokens)))
            if length == len(tokens):
                self._count(seq, 0, length)
                self.prefix.register(seq.slot, tokens, entry.logits)
                return entry.logits
        else:
            match = self.prefix.lookup(tokens, len(tokens) - 1)
            seq.slot, length = self.prefix.acquire(match) if match is not None else (self.cache.allocate(), 0)
        logits = self.runner.prefill(seq.slot, tokens[length:], start=length)[-1]
        self._count(seq, len(tokens) - length, length)
        self.prefix.register(seq.slot, tokens, logits)
        return logits

    def _prefill_one(self, seqs: list[Sequence]) -> None:
        (seq,) = seqs
        group = seq.group
        if seq.retracted:
            tokens = group.prompt_ids + seq.output_ids
            if self._shareable(seq):
                logits = self._cached_prefill(seq, tokens)
            else:
                seq.slot = self.cache.allocate()
                logits = self.runner.prefill(seq.slot, tokens, vision=group.vision)[-1]
                self.counters.add_prompt_tokens(len(tokens))
            seq.retracted = False
            self.sample_and_check([seq], logits.view(1, -1))
        elif group.prompt_logits is None:
            self._prefill_prompt(seq)
        else:
            self.sample_and_check([seq], group.prompt_logits.view(1, -1))
            if seq.finished:
                return
            self._sibling_kv(seq)

    def _admit_siblings(self, seqs: list[Sequence]) -> None:
        """The ``n > 1`` siblings of prompts prefilled before (their group holds the prompt's
        logits): every first token from one batched sampling call, and the prompt's KV copied from
        a live sibling in one indexed copy per layer for all of them (``KVCache.copy_prefixes``);
        a sibling whose group has no live source takes :meth:`_sibling_kv`'s other ways."""
        self.sample_and_check(seqs, torch.stack([s.group.prompt_logits for s in seqs]))
        copies: list[Sequence] = []
        for seq in seqs:
            if seq.finished:
                continue
            if seq.group.source_slot is None:
                self._sibling_kv(seq)  # becomes its group's source for the siblings after it
                continue
            seq.slot = self.cache.allocate()
            copies.append(seq)
        self.cache.copy_prefixes([(s.group.source_slot, s.slot, len(s.prompt_ids)) for s in copies])
        for seq in copies:
            self._count(seq, 0, len(seq.prompt_ids))
            if self.prefix is not None and self._shareable(seq):
                self.prefix.register(seq.slot, seq.prompt_ids, seq.group.prompt_logits)

    def _sibling_kv(self, seq: Sequence) -> None:
        """The prompt's KV for a sibling that already has its first token: copied from a live
        sibling, else from the prefix cache (prefilling what is not cached), else prefilled."""
        group, prompt = seq.group, seq.prompt_ids
        length = 0
        if group.source_slot is not None:
            seq.slot = self.cache.allocate()
            self.cache.copy_prefix(group.source_slot, seq.slot, len(prompt))
            length = len(prompt)
        elif self._shareable(seq):
            assert self.prefix is not None
            match = self.prefix.lookup(prompt, len(prompt))
            seq.slot, length = self.prefix.acquire(match) if match is not None else (self.cache.allocate(), 0)
        else:
            seq.slot = self.cache.allocate()
        if length < len(prompt):
            self.runner.prefill(seq.slot, prompt[length:], start=length, vision=group.vision)
        self._count(seq, len(prompt) - length, length)
        if group.source_slot is None:
            group.source_slot = seq.slot
        if self.prefix is not None and self._shareable(seq):
            self.prefix.register(seq.slot, prompt, group.prompt_logits)

    def _prefill_prompt(self, seq: Sequence) -> None:
        """A single prompt prefill (prompt logprobs, ``max_new_tokens`` 0, or images)."""
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
            if self.prefix is not None and self._shareable(seq):
                self.prefix.register(seq.slot, group.prompt_ids, logits[-1].clone())
            seq.finish_reason = finish_length(0)
            return
        self._keep(seq, group.prompt_ids, logits[-1])
        self.sample_and_check([seq], logits[-1].view(1, -1))
