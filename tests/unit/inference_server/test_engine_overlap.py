"""The overlapped engine loop (a decode step launched before the previous one is read back) gives the
same sequences as the step-by-step loop, drops the one extra token of a sequence that stopped, and
really feeds each step's device tokens to the next step."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator

import pytest
import torch
from server_helpers import Submitted, make_request

from areal_tasks.inference.server.cuda_graph import GraphModelRunner
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig

PROMPTS = [[5, 17, 33, 2], [9, 9, 100, 41, 7, 7, 3], [300], [12, 55, 81, 90, 4, 66], [250, 1, 8]]


def _start(runner: ModelRunner, overlap: bool) -> Engine:
    engine = Engine(runner, overlap=overlap)
    engine.start()
    return engine


@pytest.fixture(scope="module", params=["eager", "static"])
def any_runner(request, tiny_qwen2, one_thread) -> ModelRunner:
    """The eager runner and the static (graph-shaped, run eagerly on CPU) runner."""
    cfg = RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=6, context_length=64)
    return ModelRunner(cfg) if request.param == "eager" else GraphModelRunner(cfg, capture=False)


def _workload(stop_token: int | None) -> list[Submitted]:
    """Mixed lengths, an ``n = 3`` seeded request, a sampled one, one that fills the context and
    (with ``stop_token``) one that stops on a token mid-way."""
    reqs = [
        make_request(p, rid=f"g{i}", temperature=0.0, max_new_tokens=m, ignore_eos=True)
        for i, (p, m) in enumerate(zip(PROMPTS, (1, 2, 5, 17, 9)))
    ]
    reqs.append(
        make_request(
            PROMPTS[1], rid="n3", n=3, temperature=1.0, top_p=0.9, sampling_seed=11, max_new_tokens=12, ignore_eos=True
        )
    )
    reqs.append(make_request(PROMPTS[3], rid="long", temperature=0.0, max_new_tokens=500, ignore_eos=True))
    if stop_token is not None:
        reqs.append(
            make_request(
                PROMPTS[3], rid="stop", temperature=0.0, max_new_tokens=20, ignore_eos=True, stop_token_ids=[stop_token]
            )
        )
    return reqs


def _run(engine: Engine, reqs: list[Submitted], stagger_s: float = 0.0) -> dict[str, tuple]:
    """Submit the requests (some after the first ones are decoding) and collect each sequence's
    tokens, logprobs and finish reason by rid."""
    for req in reqs:
        engine.submit(req.seqs)
        time.sleep(stagger_s)
    out = {}
    for req in reqs:
        for seq in req.wait():
            out[seq.rid] = (seq.output_ids, seq.output_logprobs, seq.finish_reason)
    return out


def test_overlap_gives_the_same_sequences_as_step_by_step(any_runner) -> None:
    reference_engine = _start(any_runner, overlap=False)
    try:
        first = _run(reference_engine, _workload(None))
        stop_token = first["g3"][0][4]  # a token the greedy run emits at its 5th step
        reference = _run(reference_engine, _workload(stop_token), stagger_s=0.01)
    finally:
        reference_engine.shutdown()
    engine = _start(any_runner, overlap=True)
    try:
        got = _run(engine, _workload(stop_token), stagger_s=0.01)
        tokens_counted = engine.counters.generation_tokens
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert got.keys() == reference.keys()
    for rid, (tokens, logprobs, reason) in reference.items():
        assert got[rid][0] == tokens, rid
        assert got[rid][2] == reason, rid
        assert torch.allclose(torch.tensor(got[rid][1]), torch.tensor(logprobs), atol=1e-4), rid
    # the stopped sequence ends at the stop token: the token decoded after it was dropped
    stop_tokens, _, stop_reason = got["stop"]
    assert stop_reason == {"type": "stop", "matched": stop_token}
    assert stop_tokens[-1] == stop_token and stop_token not in stop_tokens[:-1] and len(stop_tokens) <= 5
    assert got["long"][2] == {"type": "length", "length": 64 - len(PROMPTS[3])}
    # dropped tokens are not counted as generated
    assert tokens_counted == sum(len(t) for t, _, _ in got.values())
    # every decode step was timed: the longest sequence alone needs one step per token after its first
    assert stats.decode_steps_total >= len(got["long"][0]) - 1
    assert 0.0 <= stats.decode_wait_seconds_total <= stats.decode_seconds_total


def test_each_step_takes_the_previous_steps_tokens_on_the_device(any_runner, monkeypatch) -> None:
    """With overlap, steady-state steps get the previous step's device tokens and are launched before
    those tokens reach the host; without it, every step's inputs come from the host."""
    calls: list[tuple[bool, list[int]]] = []
    decode, decode_again, last_slots = any_runner.decode, any_runner.decode_again, []

    def recording(slots, tokens, positions, carried=None, carried_rows=None):
        calls.append((carried is not None, list(positions)))
        last_slots[:] = slots
        return decode(slots, tokens, positions, carried, carried_rows)

    def recording_again(carried):
        # the last call's rows once more; the eager runner goes through decode (recorded there),
        # the graph runner advances its device buffers (the positions it used: its cache lengths - 1)
        before = len(calls)
        logits = decode_again(carried)
        if len(calls) == before:
            calls.append((True, [any_runner.cache.lengths[s] - 1 for s in last_slots]))
        return logits

    monkeypatch.setattr(any_runner, "decode", recording)
    monkeypatch.setattr(any_runner, "decode_again", recording_again)
    for overlap in (True, False):
        calls.clear()
        engine = _start(any_runner, overlap=overlap)
        try:
            req = make_request(PROMPTS[0], temperature=0.0, max_new_tokens=6, ignore_eos=True)
            engine.submit(req.seqs)
            (seq,) = req.wait()
        finally:
            engine.shutdown()
        assert len(seq.output_ids) == 6 and seq.pending_tokens == 0
        # the first token comes from the prefill; decode steps produce tokens 2..6 at positions 4..8
        assert [p for _, p in calls] == [[4], [5], [6], [7], [8]]
        assert [c for c, _ in calls] == ([False, True, True, True, True] if overlap else [False] * 5)


def test_a_failing_step_aborts_the_batch_and_the_engine_goes_on(any_runner, monkeypatch) -> None:
    decode, failures = any_runner.decode, []

    def failing_third_call(*args, **kwargs):
        failures.append(1)
        if len(failures) == 3:
            raise RuntimeError("device lost")
        return decode(*args, **kwargs)

    monkeypatch.setattr(any_runner, "decode", failing_third_call)
    # every step through decode (the graph runner's steady steps would not be)
    monkeypatch.setattr(any_runner, "decode_again", functools.partial(ModelRunner.decode_again, any_runner))
    engine = _start(any_runner, overlap=True)
    try:
        req = make_request(PROMPTS[2], temperature=0.0, max_new_tokens=10, ignore_eos=True)
        engine.submit(req.seqs)
        (seq,) = req.wait()
        assert seq.finish_reason["type"] == "abort" and seq.finish_reason["status_code"] == 500
        assert "device lost" in seq.finish_reason["message"]
        assert len(seq.output_ids) == 3  # the prefill's token and the two steps read back before
        after = make_request(PROMPTS[2], temperature=0.0, max_new_tokens=4, ignore_eos=True)
        engine.submit(after.seqs)
        assert after.wait()[0].finish_reason == {"type": "length", "length": 4}
    finally:
        engine.shutdown()


@pytest.fixture
def overlap_engine(runner) -> Iterator[Engine]:
    engine = _start(runner, overlap=True)
    yield engine
    engine.shutdown()


def test_a_control_call_sees_every_sampled_token(overlap_engine) -> None:
    """A pause reads the step in flight first: the aborted output is whole, with nothing unread."""
    req = make_request(PROMPTS[1], temperature=0.0, max_new_tokens=400, ignore_eos=True)
    overlap_engine.submit(req.seqs)
    (running,) = req.seqs
    deadline = time.monotonic() + 30
    while len(running.output_ids) < 2:  # decoding has begun (a fixed sleep let a fast machine finish all 400)
        assert time.monotonic() < deadline, "the engine produced no tokens"
        time.sleep(0.005)
    aborted = overlap_engine.call(lambda: overlap_engine.pause("abort")).result(timeout=30)
    (seq,) = req.wait()
    overlap_engine.call(overlap_engine.resume).result(timeout=30)
    assert aborted == 1 and seq.finish_reason["type"] == "abort"
    assert seq.pending_tokens == 0 and len(seq.output_ids) == len(seq.output_logprobs) > 1


def test_the_sampling_table_is_rebuilt_only_when_the_rows_change(runner, monkeypatch) -> None:
    """A batch keeps its rows for many steps: its sampling table (a host-to-device copy on a GPU) is
    built once for them, and again only after a row leaves."""
    from areal_tasks.inference.server import engine as engine_module

    builds = []
    real_build = engine_module.SamplingBatch.build

    def counting_build(params, generators, device, top_logprobs=None):
        builds.append(len(params))
        return real_build(params, generators, device, top_logprobs)

    monkeypatch.setattr(engine_module.SamplingBatch, "build", counting_build)
    engine = _start(runner, overlap=True)
    try:
        reqs = [
            make_request(PROMPTS[0], rid="short", temperature=1.0, max_new_tokens=6, ignore_eos=True),
            make_request(PROMPTS[1], rid="long", temperature=1.0, max_new_tokens=30, ignore_eos=True),
        ]
        for req in reqs:
            engine.submit(req.seqs)
        outputs = {seq.rid: seq.output_ids for req in reqs for seq in req.wait()}
        steps = engine.stats().decode_steps_total
    finally:
        engine.shutdown()
    assert len(outputs["long"]) == 30 and steps >= 29
    # prefill samples build their own tables; the decode steps built one per distinct set of rows
    assert builds.count(2) + builds.count(1) <= 6 < steps


def test_steady_steps_skip_the_per_row_passes(any_runner, monkeypatch) -> None:
    """A step over the rows of the step before reuses its slots and positions (one further on)
    without compacting the batch or checking every row's length budget; a row that leaves brings
    one full step back. The outputs are the step-by-step loop's."""
    compactions: list[int] = []
    real_compact = Engine._compact

    def counting_compact(self) -> None:
        compactions.append(len(self._running))
        real_compact(self)

    monkeypatch.setattr(Engine, "_compact", counting_compact)
    outputs = {}
    for overlap in (False, True):
        compactions.clear()
        engine = _start(any_runner, overlap=overlap)
        try:
            reqs = [
                make_request(PROMPTS[i], rid=f"r{i}", temperature=0.0, max_new_tokens=m, ignore_eos=True)
                for i, m in enumerate((8, 8, 20))
            ]
            engine.submit([seq for req in reqs for seq in req.seqs])  # one admission
            outputs[overlap] = {seq.rid: seq.output_ids for req in reqs for seq in req.wait()}
            steps = engine.stats().decode_steps_total
        finally:
            engine.shutdown()
        if overlap:
            # a full step first and after the two 8-token rows leave: two compactions in ~20 steps
            assert steps >= 19 and len(compactions) <= 3, compactions
        else:  # every step of the step-by-step loop is a full one
            assert len(compactions) == steps
    assert outputs[True] == outputs[False]
    assert [len(outputs[True][f"r{i}"]) for i in range(3)] == [8, 8, 20]


def test_admission_prefills_are_counted_and_timed(any_runner) -> None:
    """A burst submitted to an idle engine at once is one prefill; a later request is another; both
    are timed on the host (``areal:prefill_batches_total`` / ``areal:prefill_seconds_total``)."""
    engine = _start(any_runner, overlap=True)
    try:
        before = engine.stats()
        burst = [make_request(p, temperature=0.0, max_new_tokens=3, ignore_eos=True) for p in PROMPTS[:3]]
        engine.submit([seq for req in burst for seq in req.seqs])
        for req in burst:
            req.wait()
        after_burst = engine.stats()
        late = make_request(PROMPTS[3], temperature=0.0, max_new_tokens=3, ignore_eos=True)
        engine.submit(late.seqs)
        late.wait()
        after = engine.stats()
    finally:
        engine.shutdown()
    assert after_burst.prefill_batches_total - before.prefill_batches_total == 1
    assert after.prefill_batches_total - after_burst.prefill_batches_total == 1
    assert after_burst.prefill_seconds_total > before.prefill_seconds_total
    assert after.prefill_seconds_total > after_burst.prefill_seconds_total
