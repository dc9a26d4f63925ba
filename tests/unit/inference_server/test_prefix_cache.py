"""The prefix cache is exact: with it on, greedy output ids and per-token log-probs equal those of an
engine without it, and it prefills what it says.

* 8 separate requests with one prompt (a GRPO group sent sample by sample) prefill it once, whether
  admitted together (more than the free slots: the rest are served from live or kept KV) or later;
* a second turn (the first turn's prompt, its output, new tokens) prefills only the new tokens
  (and the first turn's last token, whose KV a length-finished turn never wrote);
* a prompt sharing part of a cached sequence reuses exactly the shared tokens, at and around block
  boundaries; less than one whole block shared reuses nothing;
* many requests over few slots (evictions, compaction swaps) stay exact, and so does a sequence
  retracted and resumed from its own kept KV.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_helpers import make_request

from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig
from areal_tasks.inference.server.prefix_cache import DEFAULT_BLOCK_SIZE
from areal_tasks.inference.server.request import Sequence

#: log-probs agree to float32 rounding (reused KV was computed by another forward shape).
ATOL = 1e-5
NEW = 8
BLOCK = DEFAULT_BLOCK_SIZE


def _tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(count)]


@pytest.fixture(scope="module")
def engines(tiny_qwen2: Path, one_thread: None) -> Iterator[dict[str, Engine]]:
    def start(slots: int, prefix_cache: bool) -> Engine:
        runner = ModelRunner(
            RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=slots, context_length=512)
        )
        engine = Engine(runner, prefix_cache=prefix_cache)
        engine.start()
        return engine

    pair = {"on": start(4, True), "off": start(8, False)}
    yield pair
    for engine in pair.values():
        engine.shutdown()


@pytest.fixture(autouse=True)
def empty_cache(engines: dict[str, Engine]) -> None:
    on = engines["on"]
    on.call(on.prefiller.drop_cache).result(timeout=30)


def _run(engine: Engine, prompts: list[list[int]], **params: Any) -> list[Sequence]:
    """Submit one request per prompt at once (greedy) and wait for them."""
    params = {"temperature": 0.0, "max_new_tokens": NEW, "ignore_eos": True, **params}
    requests = [make_request(p, rid=f"q{i}", **params) for i, p in enumerate(prompts)]
    engine.submit([s for r in requests for s in r.seqs])
    return [r.wait()[0] for r in requests]


def _counted(engine: Engine, prompts: list[list[int]], **params: Any) -> tuple[list[Sequence], int, int]:
    """``_run`` and the prompt positions it prefilled and took from the cache."""
    before = engine.stats()
    seqs = _run(engine, prompts, **params)
    after = engine.stats()
    return (
        seqs,
        after.prompt_tokens_total - before.prompt_tokens_total,
        after.cached_tokens_total - before.cached_tokens_total,
    )


def _same(got: list[Sequence], want: list[Sequence]) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.finish_reason == b.finish_reason
        assert a.output_ids == b.output_ids
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=ATOL)


def test_separate_requests_with_one_prompt_are_prefilled_once(engines: dict[str, Engine]) -> None:
    prompt = _tokens(1, 64)
    want = _run(engines["off"], [prompt] * 8)
    # 8 requests on 4 slots: one prefill, three copies now, four served later from kept KV
    got, prefilled, cached = _counted(engines["on"], [prompt] * 8)
    _same(got, want)
    assert prefilled == 64 and cached == 7 * 64
    assert sorted(s.cached_tokens for s in got) == [0] + [64] * 7
    # later requests with that prompt: no forward at all
    later, prefilled, cached = _counted(engines["on"], [prompt] * 3)
    _same(later, want[:3])
    assert (prefilled, cached) == (0, 3 * 64)


def test_n_samples_and_separate_requests_share_one_prefill(engines: dict[str, Engine]) -> None:
    prompt = _tokens(2, 40)
    params = {"temperature": 1.0, "sampling_seed": 11, "max_new_tokens": 6}
    results = {}
    for name, engine in engines.items():
        requests = [make_request(prompt, rid="g", n=3, **params), make_request(prompt, rid="s", **params)]
        before = engine.stats().prompt_tokens_total
        engine.submit([s for r in requests for s in r.seqs])
        results[name] = ([s for r in requests for s in r.wait()], engine.stats().prompt_tokens_total - before)
    _same(results["on"][0], results["off"][0])
    assert results["on"][1] == len(prompt)  # an n = 3 request and a separate one: one prefill
    assert results["off"][1] == 2 * len(prompt)  # without the cache: once per request


def test_a_second_turn_prefills_only_its_new_tokens(engines: dict[str, Engine]) -> None:
    first = _tokens(3, 40)
    (turn1,) = _run(engines["off"], [first], max_new_tokens=12)
    (cached1,), _, _ = _counted(engines["on"], [first], max_new_tokens=12)
    _same([cached1], [turn1])
    second = first + turn1.output_ids + _tokens(4, 5)
    want = _run(engines["off"], [second])
    (got,), prefilled, cached = _counted(engines["on"], [second])
    _same([got], want)
    # the first turn's KV: its prompt and output but the last token (length-finished: never fed back)
    assert cached == got.cached_tokens == len(first) + 12 - 1
    assert prefilled == len(second) - cached == 5 + 1
    # a third turn extends the second the same way
    third = second + got.output_ids + _tokens(5, 3)
    (got3,), prefilled, cached = _counted(engines["on"], [third])
    _same([got3], _run(engines["off"], [third]))
    assert (prefilled, cached) == (3 + 1, len(second) + NEW - 1)


def test_second_turns_admitted_together_prefill_their_rests_in_one_forward(engines: dict[str, Engine]) -> None:
    """Three first turns of different lengths, then their second turns (new tokens of different
    lengths) in one admission: the uncached rests are prefilled by one ragged forward, exactly."""
    on = engines["on"]
    firsts = [_tokens(20 + i, n) for i, n in enumerate((24, 40, 33))]
    turn1 = _run(on, firsts, max_new_tokens=6)
    seconds = [f + t.output_ids + _tokens(30 + i, k) for i, (f, t, k) in enumerate(zip(firsts, turn1, (2, 7, 4)))]
    want = _run(engines["off"], seconds)
    calls: list[int] = []
    runner = on.runner
    original = runner.prefill_from

    def counting(slots, suffixes, starts):
        calls.append(len(slots))
        return original(slots, suffixes, starts)

    runner.prefill_from = counting
    try:
        got, prefilled, cached = _counted(on, seconds)
    finally:
        del runner.prefill_from
    _same(got, want)
    assert calls == [3]
    assert cached == sum(len(f) + 6 - 1 for f in firsts)
    assert prefilled == sum(len(s) for s in seconds) - cached


def test_a_repeated_wave_over_full_retained_slots_needs_no_per_sequence_forward(
    engines: dict[str, Engine],
) -> None:
    """Every slot retained (a first wave of as many prompts as slots), then the same prompts again:
    served from the cache with no forward of one sequence (taking slots one by one used to evict the
    entries of the wave's later prompts, each then prefilled alone: launch-bound on a GPU)."""
    on = engines["on"]
    prompts = [_tokens(60 + i, 40) for i in range(4)]  # the "on" engine has 4 slots
    first = _run(on, prompts)
    assert len(on.runner.cache.retained_slots) == 4
    runner = on.runner
    singles: list[int] = []
    original = runner.prefill

    def counting(slot, token_ids, start=0, all_logits=False):
        singles.append(slot)
        return original(slot, token_ids, start, all_logits)

    runner.prefill = counting
    try:
        again, prefilled, cached = _counted(on, prompts)
    finally:
        del runner.prefill
    _same(again, first)
    assert singles == []
    assert cached >= 3 * 40 and prefilled + cached == 4 * 40


@pytest.mark.parametrize("shared", [BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK - 1, 2 * BLOCK, 3 * BLOCK - 1, 3 * BLOCK])
def test_a_prompt_sharing_part_of_a_cached_sequence_reuses_exactly_that_part(
    engines: dict[str, Engine], shared: int
) -> None:
    base = _tokens(6, 3 * BLOCK)
    (first,) = _run(engines["on"], [base], max_new_tokens=4)
    kept = base + first.output_ids  # what the cache holds (but the last token)
    tail = _tokens(7, 9)
    if tail[0] == kept[shared]:  # the prompt leaves the cached sequence right after ``shared`` tokens
        tail[0] = tail[0] % 999 + 1
    prompt = base[:shared] + tail
    want = _run(engines["off"], [prompt])
    (got,), prefilled, cached = _counted(engines["on"], [prompt])
    _same([got], want)
    reused = shared if shared >= BLOCK else 0  # less than a whole block in common: nothing
    assert (cached, prefilled) == (reused, len(prompt) - reused)


def test_a_prefix_of_a_cached_prompt_reuses_all_but_its_last_token(engines: dict[str, Engine]) -> None:
    base = _tokens(8, 3 * BLOCK)
    _run(engines["on"], [base], max_new_tokens=2)
    for length in (2 * BLOCK, 2 * BLOCK + 5):
        prompt = base[:length]
        (got,), prefilled, cached = _counted(engines["on"], [prompt])
        _same([got], _run(engines["off"], [prompt]))
        assert (cached, prefilled) == (length - 1, 1)  # its logits need one forward of the last token


def test_many_requests_over_few_slots_stay_exact(engines: dict[str, Engine]) -> None:
    stem = _tokens(9, 2 * BLOCK)
    prompts = [stem + _tokens(10 + i, 3 + 5 * i) for i in range(5)]  # a shared system prompt
    prompts += [_tokens(20 + i, 20 + 7 * i) for i in range(4)]  # unrelated
    prompts += [prompts[0], prompts[6], prompts[2]]  # repeats
    lengths = {"max_new_tokens": 10}
    want = _run(engines["off"], prompts, **lengths)
    for _ in range(2):  # the second round finds a cache filled (and evicted) by the first
        got, _, cached = _counted(engines["on"], prompts, **lengths)
        _same(got, want)
        assert cached > 0
    on = engines["on"]
    assert on.prefix_cache is not None and on.prefix_cache.entries <= on.runner.cache.num_slots
    assert on.runner.cache.retained_slots == sorted(on.runner.cache.free_slot_ids())
    # second turns of all of them at once, over four slots
    seconds = [p + s.output_ids + [5, 6, 7] for p, s in zip(prompts, want)]
    got, prefilled, cached = _counted(on, seconds, max_new_tokens=5)
    _same(got, _run(engines["off"], seconds, max_new_tokens=5))
    assert prefilled + cached == sum(len(p) for p in seconds) and cached > 0


def test_a_retracted_sequence_resumes_from_its_kept_kv(engines: dict[str, Engine]) -> None:
    prompt = _tokens(30, 24)
    want = _run(engines["off"], [prompt], max_new_tokens=120)
    on = engines["on"]
    request = make_request(prompt, rid="retract", temperature=0.0, max_new_tokens=120, ignore_eos=True)
    on.submit(request.seqs)
    seq = request.seqs[0]
    while len(seq.output_ids) < 10 and not seq.finished:
        time.sleep(0.001)
    before = on.stats()
    on.call(lambda: on.pause("retract")).result(timeout=30)
    done = len(seq.output_ids)
    on.call(on.resume).result(timeout=30)
    request.wait()
    after = on.stats()
    _same([seq], want)
    assert seq.num_retractions == 1
    # the resume prefilled the one token whose KV was not written yet
    assert after.prompt_tokens_total - before.prompt_tokens_total == 1
    assert seq.cached_tokens == len(prompt) + done - 1
