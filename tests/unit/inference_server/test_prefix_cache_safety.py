"""What the prefix cache must never reuse, and its switch and figures.

* After a weight update nothing computed under the old weights is reused: every entry is dropped
  (a sequence running across the update keeps no KV when it ends), and the answers equal those of
  a fresh engine loaded with the new weights.
* Prompts with images are neither served from nor kept in the cache: an image prompt whose
  expanded ids equal a cached text prompt's prefills in full and equals transformers' answer.
* A request for prompt logprobs prefills its whole prompt (it needs every prompt position's logits).
* On a runner whose static decode steps pad the batch (``cuda_graph.py``, run eagerly on the CPU),
  the entries of the padded free slots move above the padding (or are dropped without room) before
  the step, and answers stay exact.
* ``prefix_cache=False`` turns it off; ``/metrics`` reports cached tokens and the hit rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_helpers import make_request
from test_prefix_cache import _counted, _run, _same, _tokens
from vision_helpers import load_reference, png, prompt_with_images, reference_greedy

from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.metrics import render_metrics
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig
from areal_tasks.inference.server.server import ServerConfig, WeightBounds
from areal_tasks.inference.server.stats import EngineStats
from areal_tasks.inference.server.weight_service import WeightService

NEW = 8


def _engine(path: Path, slots: int = 4, prefix_cache: bool = True, runner: ModelRunner | None = None) -> Engine:
    runner = runner or ModelRunner(
        RunnerConfig(str(path), device="cpu", max_running_requests=slots, context_length=512)
    )
    engine = Engine(runner, prefix_cache=prefix_cache)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def plain(tiny_qwen2: Path, one_thread: None) -> Iterator[Engine]:
    engine = _engine(tiny_qwen2, slots=8, prefix_cache=False)
    yield engine
    engine.shutdown()


def test_a_weight_update_leaves_nothing_stale(tiny_qwen2: Path, tiny_model_factory: Any, plain: Engine) -> None:
    updated = tiny_model_factory("qwen2", seed=1)
    engine, fresh = _engine(tiny_qwen2), _engine(updated, slots=8, prefix_cache=False)
    try:
        prompt, stem = _tokens(40, 48), _tokens(41, 32)
        old = _run(engine, [prompt, [*stem, 5, 6, 7]])
        _same(old, _run(plain, [prompt, [*stem, 5, 6, 7]]))
        running = make_request(_tokens(42, 20), rid="across", temperature=0.0, max_new_tokens=300, ignore_eos=True)
        engine.submit(running.seqs)
        while len(running.seqs[0].output_ids) < 5:
            time.sleep(0.001)
        engine.call(lambda: engine.pause("in_place")).result(timeout=30)

        async def update() -> tuple[bool, str]:
            service = WeightService(engine, WeightBounds(roots=(str(updated),)))
            return await service.update_from_disk(str(updated), None, False, None, False)

        assert asyncio.run(update())[0]
        assert engine.prefix_cache is not None and engine.prefix_cache.entries == 0
        assert engine.runner.cache.retained_slots == []
        engine.call(engine.resume).result(timeout=30)
        running.wait()
        # the sequence that ran across the update keeps nothing: its KV mixes both weights
        assert engine.prefix_cache.entries == 0 and engine.runner.cache.retained_slots == []
        queries = [prompt, [*stem, 5, 6, 7], [*prompt[:40], 9, 9]]
        got, prefilled, cached = _counted(engine, queries)
        want = _run(fresh, queries)
        _same(got, want)
        assert got[0].output_ids != old[0].output_ids  # the new weights answer differently
        # nothing kept from before; the queries, admitted together, are all prefilled
        assert cached == 0 and prefilled == sum(len(q) for q in queries) - cached
        # KV computed under the new weights is reused again
        again, prefilled, cached = _counted(engine, queries)
        _same(again, want)
        assert cached >= len(queries[0]) and prefilled + cached == sum(len(q) for q in queries)
    finally:
        engine.shutdown()
        fresh.shutdown()


def test_prompt_logprob_requests_prefill_the_whole_prompt(tiny_qwen2: Path, plain: Engine) -> None:
    engine = _engine(tiny_qwen2)
    try:
        prompt = _tokens(50, 40)
        _run(engine, [prompt])

        def with_prompt_logprobs(target: Engine) -> Any:
            req = make_request(prompt, rid="input", temperature=0.0, max_new_tokens=NEW, ignore_eos=True)
            req.seqs[0].logprob_start_len = 0
            before = target.stats()
            target.submit(req.seqs)
            (seq,) = req.wait()
            after = target.stats()
            counts = (
                after.prompt_tokens_total - before.prompt_tokens_total,
                after.cached_tokens_total - before.cached_tokens_total,
            )
            return seq, counts

        (got, counts), (want, _) = with_prompt_logprobs(engine), with_prompt_logprobs(plain)
        _same([got], [want])
        assert counts == (len(prompt), 0)
        assert got.group.input_logprobs[0] is None
        assert got.group.input_logprobs[1:] == pytest.approx(want.group.input_logprobs[1:], abs=1e-5)
        # its KV is kept like any other: a plain request with that prompt reuses it
        (later,), prefilled, cached = _counted(engine, [prompt])
        assert (prefilled, cached) == (0, len(prompt))
        _same([later], [want])
    finally:
        engine.shutdown()


def test_image_prompts_are_never_shared(tiny_model_factory: Any, one_thread: None) -> None:
    path = tiny_model_factory("qwen2_vl")
    engine = _engine(path, slots=4)
    reference = load_reference(path)
    try:
        runner = engine.runner
        ids, vision = runner.vision.prepare(prompt_with_images(1, text=tuple(range(40, 60))), [png(4, 48, 40)])
        want_ids, want_logprobs = reference_greedy(reference, ids, vision, NEW)

        def image_request(rid: str) -> Any:
            req = make_request(ids, rid=rid, temperature=0.0, max_new_tokens=NEW)
            req.seqs[0].group.vision = vision
            return req

        # the same ids as text (image pads as plain tokens), twice: cached like any text prompt
        (text,) = _run(engine, [ids])
        _, prefilled, cached = _counted(engine, [ids])
        assert (prefilled, cached) == (0, len(ids))
        # a text turn extending it prefills from the cached position, on the vision model too
        turn = [*ids, *text.output_ids, 44, 45]
        (second,), prefilled, cached = _counted(engine, [turn])
        assert cached == len(ids) + NEW - 1 and prefilled == 3
        expected_ids, expected_logprobs = reference_greedy(reference, turn, None, NEW)
        assert second.output_ids == expected_ids
        assert second.output_logprobs == pytest.approx(expected_logprobs, abs=2e-5)
        for rid in ("img0", "img1"):
            req = image_request(rid)
            before = engine.stats()
            engine.submit(req.seqs)
            (seq,) = req.wait()
            after = engine.stats()
            assert seq.output_ids == want_ids
            assert seq.output_logprobs == pytest.approx(want_logprobs, abs=2e-5)
            assert after.prompt_tokens_total - before.prompt_tokens_total == len(ids)
            assert after.cached_tokens_total == before.cached_tokens_total and seq.cached_tokens == 0
        # the image prompts' KV (image features at the pads) was not kept: only the text runs'
        assert engine.prefix_cache is not None
        kept = [engine.prefix_cache.entry(s) for s in runner.cache.retained_slots]
        assert len(kept) == engine.prefix_cache.entries == 2  # the turn took over the first run's slot
        assert all(e is not None and e.tokens[: len(ids)] == ids for e in kept)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("slots", [6, 8])
def test_padded_static_steps_spare_the_entries_they_would_overwrite(
    tiny_qwen2: Path, plain: Engine, slots: int
) -> None:
    """Four kept prompts, then three new sequences in slots 0..2 decoded as a padded batch of 4:
    slot 3's entry moves above the padding where a free empty slot is left (8 slots), or is
    dropped (6 slots: every free slot keeps an entry)."""
    from areal_tasks.inference.server.cuda_graph import GraphModelRunner

    runner = GraphModelRunner(
        RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=slots, context_length=512), capture=False
    )
    assert runner.buckets[:3] == [1, 2, 4]
    engine = _engine(tiny_qwen2, runner=runner)
    try:
        first = [_tokens(60 + i, 20 + i) for i in range(4)]
        _same(_run(engine, first), _run(plain, first))
        assert runner.cache.retained_slots == [0, 1, 2, 3]
        second = [_tokens(70 + i, 18) for i in range(3)]
        _same(_run(engine, second, max_new_tokens=12), _run(plain, second, max_new_tokens=12))
        assert engine.prefix_cache is not None
        moved = engine.prefix_cache.exact(first[3])
        assert (moved is not None) == (slots == 8) and engine.prefix_cache.entry(3) is None
        # the prompt that lived in slot 3 answers exactly: from its moved KV, or prefilled again
        (alone,), prefilled, _ = _counted(engine, [first[3]])
        assert prefilled == (0 if slots == 8 else len(first[3]))
        _same([alone], _run(plain, [first[3]]))
        again = first + second
        _same(_run(engine, again), _run(plain, again))
    finally:
        engine.shutdown()


def test_the_switch_and_the_figures(tiny_qwen2: Path, plain: Engine) -> None:
    assert not ServerConfig(model_path=str(tiny_qwen2)).prefix_cache  # off by default (engine.py says why)
    assert ServerConfig(model_path=str(tiny_qwen2), prefix_cache=True).prefix_cache
    prompt = _tokens(80, 30)
    _, prefilled, cached = _counted(plain, [prompt] * 3)
    assert (prefilled, cached) == (3 * len(prompt), 0)
    stats = plain.stats()
    assert not stats.prefix_cache and stats.prefix_cache_entries == 0 and plain.runner.cache.retained_slots == []
    figures = EngineStats(
        num_running=0,
        num_waiting=0,
        paused=None,
        draining=False,
        prompt_tokens_total=30,
        generation_tokens_total=0,
        requests_finished_total=0,
        gen_throughput=0.0,
        cache_used_tokens=0,
        cache_capacity_tokens=100,
        weight_version="0",
        cached_tokens_total=90,
        prefix_cache=True,
        prefix_cache_entries=3,
        prefix_cache_retained_tokens=64,
    )
    lines = render_metrics(figures, "m").splitlines()
    assert 'sglang:cached_tokens_total{model_name="m"} 90.0' in lines
    assert 'sglang:cache_hit_rate{model_name="m"} 0.75' in lines
    assert 'areal:prefix_cache_entries{model_name="m"} 3.0' in lines
    assert 'areal:prefix_cache_retained_tokens{model_name="m"} 64.0' in lines


def test_a_retained_slot_is_taken_outside_inference_mode(tiny_qwen2: Path, one_thread: None) -> None:
    """Taking a slot whose kept content must move works from any caller (the KV tensors are
    inference tensors: moving them outside ``torch.inference_mode`` used to raise)."""
    import torch

    runner = ModelRunner(RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=2, context_length=64))
    cache = runner.cache
    slot = cache.allocate()
    runner.prefill(slot, [5, 6, 7])
    kept = [t[:, slot, :, :3].clone() for t in cache.kv.values()]  # [2, slots, heads, len, dim]
    cache.release(slot, retain=True)
    assert not torch.is_inference_mode_enabled()
    taken = cache.allocate()  # the lowest free slot: the retained one, whose content moves up
    assert taken == slot and cache.retained_slots == [1] and cache.lengths[1] == 3
    for before, store in zip(kept, cache.kv.values()):
        assert torch.equal(store[:, 1, :, :3], before)
