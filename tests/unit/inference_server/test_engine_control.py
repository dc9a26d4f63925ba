"""Engine behaviour: finish rules, pause modes, weight-version spans and request validation."""

from __future__ import annotations

import time

import pytest
import torch
from server_helpers import generate, make_request

from areal_tasks.errors import InferenceRequestError

PROMPT = [5, 6, 7, 8]


def _wait_tokens(seq, count: int) -> None:
    while len(seq.output_ids) < count and not seq.finished:
        time.sleep(0.001)


def test_stop_token_ids_and_eos(engine) -> None:
    base = generate(engine, PROMPT, temperature=0.0, max_new_tokens=12, ignore_eos=True)
    stop_at = base.output_ids[4]
    first = base.output_ids.index(stop_at)
    seq = generate(engine, PROMPT, temperature=0.0, max_new_tokens=12, stop_token_ids=frozenset({stop_at}))
    assert seq.output_ids == base.output_ids[: first + 1]
    assert seq.finish_reason == {"type": "stop", "matched": stop_at}
    # the model's EOS ends a sequence unless ignore_eos
    engine.runner.eos_token_ids, saved = frozenset({stop_at}), engine.runner.eos_token_ids
    engine.finisher.eos_token_ids = engine.runner.eos_token_ids
    try:
        assert generate(engine, PROMPT, temperature=0.0, max_new_tokens=12).output_ids == seq.output_ids
        assert (
            generate(engine, PROMPT, temperature=0.0, max_new_tokens=12, ignore_eos=True).output_ids == base.output_ids
        )
    finally:
        engine.runner.eos_token_ids = engine.finisher.eos_token_ids = saved


def test_stop_string_matches_the_decoded_tail(engine) -> None:
    base = generate(engine, PROMPT, temperature=0.0, max_new_tokens=12, ignore_eos=True)
    tokenizer = engine.runner.tokenizer
    text = tokenizer.decode(base.output_ids[5:7])
    stop = text.strip() or text
    seq = generate(engine, PROMPT, temperature=0.0, max_new_tokens=12, ignore_eos=True, stop=(stop,))
    assert seq.finish_reason == {"type": "stop", "matched": stop}
    assert len(seq.output_ids) <= 7 and seq.output_ids == base.output_ids[: len(seq.output_ids)]
    assert stop in tokenizer.decode(seq.output_ids)


def test_max_new_tokens_zero_and_context_limit(engine) -> None:
    seq = generate(engine, PROMPT, max_new_tokens=0)
    assert seq.output_ids == [] and seq.finish_reason == {"type": "length", "length": 0}
    context = engine.runner.max_len
    long_prompt = [9] * (context - 3)
    seq = generate(engine, long_prompt, temperature=0.0, max_new_tokens=50, ignore_eos=True)
    assert len(seq.output_ids) == 3 and seq.finish_reason == {"type": "length", "length": 3}


@pytest.mark.parametrize("prompt, fragment", [([], "empty"), ([1] * 600, "context length"), ([5000], "vocabulary")])
def test_invalid_prompts_are_refused(engine, prompt, fragment) -> None:
    with pytest.raises(InferenceRequestError, match=fragment):
        engine.submit(make_request(prompt).seqs)


def test_pause_abort_returns_partial_output_and_holds_new_requests(engine) -> None:
    running = make_request(PROMPT, rid="victim", temperature=0.0, max_new_tokens=400, ignore_eos=True)
    engine.submit(running.seqs)
    _wait_tokens(running.seqs[0], 3)
    assert engine.call(lambda: engine.pause("abort")).result(timeout=30) == 1
    victim = running.wait()[0]
    assert victim.finish_reason["type"] == "abort"
    assert 3 <= len(victim.output_ids) < 400 and len(victim.output_logprobs) == len(victim.output_ids)
    late = make_request(PROMPT, rid="late", temperature=0.0, max_new_tokens=5)
    engine.submit(late.seqs)
    assert engine.stats().num_waiting == 1 and engine.stats().paused == "abort"
    assert not late.futures[0].done()
    engine.call(engine.resume).result(timeout=30)
    done = late.wait()[0]
    assert done.finish_reason["type"] == "length"
    # the partial output is a prefix of the full greedy output: a client can resubmit prompt + partial
    full = generate(engine, PROMPT, temperature=0.0, max_new_tokens=len(victim.output_ids) + 5, ignore_eos=True)
    assert full.output_ids[: len(victim.output_ids)] == victim.output_ids


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_without_abort_continues_to_the_same_output(engine, mode: str) -> None:
    want = generate(engine, PROMPT, temperature=0.0, max_new_tokens=40, ignore_eos=True)
    req = make_request(PROMPT, rid=mode, temperature=0.0, max_new_tokens=40, ignore_eos=True)
    engine.submit(req.seqs)
    _wait_tokens(req.seqs[0], 5)
    engine.call(lambda: engine.pause(mode)).result(timeout=30)
    frozen = len(req.seqs[0].output_ids)
    assert not req.futures[0].done() and frozen < 40
    if mode == "retract":
        assert req.seqs[0].slot is None and engine.stats().num_waiting == 1
    engine.call(engine.resume).result(timeout=30)
    seq = req.wait()[0]
    assert seq.output_ids == want.output_ids
    assert seq.num_retractions == (1 if mode == "retract" else 0)


def test_a_retracted_sequence_ends_at_the_context_after_resuming(engine, monkeypatch) -> None:
    """Retracted and admitted again, three times (the same rows as before each pause; each re-prefill
    samples a token outside a decode step), a sequence bounded by the context stops exactly there and
    is not decoded once more after its last token was launched (the step that reads it frees it)."""
    context = engine.runner.max_len
    positions: list[int] = []
    decode = engine.runner.decode

    def recording(slots, tokens, step_positions, *args, **kwargs):
        positions.extend(step_positions)
        return decode(slots, tokens, step_positions, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "decode", recording)
    prompt = [9] * (context - 24)
    req = make_request(prompt, rid="edge", temperature=0.0, max_new_tokens=100, ignore_eos=True)
    engine.submit(req.seqs)
    for retraction in range(3):
        _wait_tokens(req.seqs[0], 3 + 4 * retraction)
        engine.call(lambda: engine.pause("retract")).result(timeout=30)
        engine.call(engine.resume).result(timeout=30)
    (seq,) = req.wait()
    assert seq.finish_reason == {"type": "length", "length": 24} and len(seq.output_ids) == 24
    assert seq.num_retractions == 3
    assert max(positions) == context - 2  # the decode that makes the 24th token; none after it


def test_weight_change_mid_sequence_records_version_spans(engine) -> None:
    runner = engine.runner
    req = make_request(PROMPT, rid="spans", temperature=0.0, max_new_tokens=30, ignore_eos=True)
    engine.submit(req.seqs)
    _wait_tokens(req.seqs[0], 4)
    engine.call(lambda: engine.pause("in_place")).result(timeout=30)
    old_version = engine.weight_version
    head = runner.model.get_output_embeddings().weight
    saved = head.detach().clone()
    split = len(req.seqs[0].output_ids)

    def swap(weights, version):
        def apply():
            runner.load_weights([("lm_head.weight", weights)])
            engine.weights_changed(version)

        return apply

    try:
        engine.call(swap(saved * -1.0, "7")).result(timeout=30)
        engine.call(engine.resume).result(timeout=30)
        seq = req.wait()[0]
    finally:
        engine.call(swap(saved, old_version)).result(timeout=30)
    assert seq.version_events == [(old_version, split)]
    from areal_tasks.inference.server.protocol import weight_version_spans

    assert weight_version_spans(seq, "7") == [
        {"version": old_version, "start": 0, "end": split},
        {"version": "7", "start": split, "end": 30},
    ]
    assert torch.equal(head, saved)


def test_abort_by_rid_prefix_catches_all_samples(engine) -> None:
    engine.call(lambda: engine.pause("in_place")).result(timeout=30)
    req = make_request(PROMPT, rid="group", n=3, max_new_tokens=50)
    other = make_request(PROMPT, rid="other", max_new_tokens=2)
    engine.submit(req.seqs + other.seqs)
    assert engine.call(lambda: engine.abort_rid("group")).result(timeout=30) == 3
    engine.call(engine.resume).result(timeout=30)
    assert all(s.finish_reason["type"] == "abort" and s.output_ids == [] for s in req.wait())
    assert other.wait()[0].finish_reason["type"] == "length"


def test_abort_names_a_request_never_a_bare_prefix(engine) -> None:
    """``""`` aborts nothing (SGLang's prefix rule made it every request), nor does a prefix that is
    not a whole rid; a batch's rid reaches its prompts' samples; held sequences are aborted too."""
    engine.call(lambda: engine.pause("in_place")).result(timeout=30)
    batch = make_request(PROMPT, rid="b_1", n=2, max_new_tokens=50)  # batch "b", prompt 1: b_1_0, b_1_1
    near = make_request(PROMPT, rid="bb", max_new_tokens=2)
    engine.submit(batch.seqs + near.seqs)
    for rid in ("", "b_", "b_1_"):
        assert engine.call(lambda rid=rid: engine.abort_rid(rid)).result(timeout=30) == 0
    assert engine.call(lambda: engine.abort_rid("b")).result(timeout=30) == 2
    engine.set_gate(True)
    held = make_request(PROMPT, rid="held", max_new_tokens=2)
    engine.submit(held.seqs)
    assert engine.call(lambda: engine.abort_rid("held")).result(timeout=30) == 1
    engine.set_gate(False)
    engine.call(engine.resume).result(timeout=30)
    assert all(s.finish_reason["type"] == "abort" for s in batch.wait() + held.wait())
    assert near.wait()[0].finish_reason["type"] == "length"


def test_running_sequences_are_compacted_into_the_lowest_slots(engine, monkeypatch) -> None:
    want = generate(engine, [9, 8, 7, 6], temperature=0.0, max_new_tokens=80, ignore_eos=True).output_ids
    cache = engine.runner.cache
    moves: list[tuple[int, int]] = []
    move_many = cache.move_many

    def recording(batch: list[tuple[int, int]]) -> None:
        moves.extend(batch)
        move_many(batch)

    # recorded in the engine thread: b can finish (and c move) before this thread first looks at c
    monkeypatch.setattr(cache, "move_many", recording)
    reqs = [
        make_request(PROMPT, rid="a", temperature=0.0, max_new_tokens=80, ignore_eos=True),
        make_request(PROMPT, rid="b", temperature=0.0, max_new_tokens=2, ignore_eos=True),
        make_request([9, 8, 7, 6], rid="c", temperature=0.0, max_new_tokens=80, ignore_eos=True),
    ]
    engine.submit([r.seqs[0] for r in reqs])
    c = reqs[2].seqs[0]
    _wait_tokens(c, 1)
    reqs[1].wait()
    while c.slot == 2 and not c.finished:
        time.sleep(0.001)
    assert c.slot == 1
    assert moves == [(2, 1)]  # c started in slot 2 and moved into b's freed slot 1, once
    assert reqs[2].wait()[0].output_ids == want
