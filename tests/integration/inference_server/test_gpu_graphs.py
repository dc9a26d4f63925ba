"""CUDA-graph decode on a GPU (skipped without CUDA): replayed graphs give the eager decode's tokens
and logits, across batch and KV-length buckets, and the engine on the graph runner still matches
``transformers.generate`` greedily in fp32; sampling and the top-logprob alternatives never wait
for the device, and the alternatives on the graph runner match a transformers forward."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from areal_tasks.inference.server.cuda_graph import GraphModelRunner, build_runner
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig
from areal_tasks.inference.server.request import Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [100, 200, 300, 400, 500], [42] * 20, [3, 1, 4]]


def _finished(
    engine: Engine, rows: list[tuple[list[int], SamplingParams]], prefix: str, alternatives: list[int] | None = None
) -> list[Sequence]:
    """Run one sequence per ``(prompt, params)`` row on ``engine`` and return them finished, in
    order; with ``alternatives`` every row returns log-probs and that many top alternatives."""
    futures: list[concurrent.futures.Future] = []
    seqs = []
    for i, (prompt, params) in enumerate(rows):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        seqs.append(
            Sequence(
                rid=f"{prefix}{i}",
                group=SequenceGroup(prompt),
                params=params,
                on_finish=lambda s, f=fut: f.set_result(s),
                return_logprob=alternatives is not None,
                top_logprobs_num=0 if alternatives is None else alternatives[i],
            )
        )
        futures.append(fut)
    engine.submit(seqs)
    return [f.result(timeout=300) for f in futures]


def _decode_all(runner: ModelRunner, steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    slots = [runner.cache.allocate() for _ in PROMPTS]
    logits = runner.prefill_batch(slots, PROMPTS)
    outs, rows = [[int(r.argmax())] for r in logits], []
    for _ in range(steps - 1):
        positions = [len(p) + len(o) - 1 for p, o in zip(PROMPTS, outs)]
        step = runner.decode(slots, [o[-1] for o in outs], positions)
        rows.append(step.clone())
        for out, row in zip(outs, step):
            out.append(int(row.argmax()))
    for slot in slots:
        runner.cache.release(slot)
    return outs, rows


@pytest.mark.parametrize("scope", ["pointwise", "blocks"])
def test_graph_replay_equals_eager_decode(tiny_qwen2: Path, scope: str) -> None:
    cfg = RunnerConfig(
        str(tiny_qwen2), device="cuda", dtype="float32", max_running_requests=8, context_length=600, compile_scope=scope
    )
    graphs = GraphModelRunner(cfg)
    assert graphs.capture and len(graphs.lengths) == 3
    assert graphs.compile_scope == scope  # no fall-back: the whole blocks compiled and were captured
    eager = ModelRunner(cfg)
    got, got_rows = _decode_all(graphs, 300)  # crosses the 256 KV-length bucket
    want, want_rows = _decode_all(eager, 300)
    assert got == want
    assert max(float((a - b).abs().max()) for a, b in zip(got_rows, want_rows)) < 1e-4


def test_decode_again_replays_from_the_device_without_waiting(tiny_qwen2: Path) -> None:
    """The engine's steady steps on the captured graphs (``decode_again``: positions advanced on the
    device, the sampled tokens fed back without a read-back) never synchronise and give the tokens
    of host-fed decoding, across the 256 KV-length bucket, with a padding row (5 rows in a bucket
    of 8)."""
    cfg = RunnerConfig(str(tiny_qwen2), device="cuda", dtype="float32", max_running_requests=8, context_length=600)
    graphs = GraphModelRunner(cfg)
    want, _ = _decode_all(ModelRunner(cfg), 300)
    slots = [graphs.cache.allocate() for _ in PROMPTS]
    first = graphs.prefill_batch(slots, PROMPTS).argmax(dim=-1)
    tokens = graphs.decode(slots, first.tolist(), [len(p) for p in PROMPTS]).argmax(dim=-1)
    picked = [first, tokens]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(300 - 2):
            tokens = graphs.decode_again(tokens).argmax(dim=-1)
            picked.append(tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.stack(picked, dim=1).tolist() == want
    assert [graphs.cache.lengths[s] for s in slots] == [len(p) + 299 for p in PROMPTS]


def test_bf16_graphs_with_the_triton_decode_attention_match_sdpa(tiny_qwen2: Path) -> None:
    """The captured bf16 steps with the Triton kernel (the CUDA default) against the same steps
    with SDPA, fed the same tokens: logits agree to bf16 precision in every batch and KV bucket."""
    from areal_tasks.inference.server.decode_kernel import kernel_available

    if not kernel_available():
        pytest.skip("triton does not import")
    base = {
        "model_path": str(tiny_qwen2),
        "device": "cuda",
        "dtype": "bfloat16",
        "max_running_requests": 8,
        "context_length": 600,
    }
    kernel = GraphModelRunner(RunnerConfig(**base))
    sdpa = GraphModelRunner(RunnerConfig(**base, decode_attention="sdpa"))
    assert (kernel.decode_attention, sdpa.decode_attention) == ("triton", "sdpa")
    outs, _ = _decode_all(kernel, 300)  # crosses the 256 KV-length bucket
    slots = {name: [r.cache.allocate() for _ in PROMPTS] for name, r in (("kernel", kernel), ("sdpa", sdpa))}
    worst = 0.0
    for name, runner in (("kernel", kernel), ("sdpa", sdpa)):
        runner.prefill_batch(slots[name], PROMPTS)
    for step in range(len(outs[0]) - 1):
        tokens = [o[step] for o in outs]
        positions = [len(p) + step for p in PROMPTS]
        a = kernel.decode(slots["kernel"], tokens, positions).float()
        b = sdpa.decode(slots["sdpa"], tokens, positions).float()
        worst = max(worst, float((a - b).abs().max() / b.abs().max()))
    assert worst < 2e-2


def test_engine_on_graph_runner_matches_generate(tiny_qwen2: Path) -> None:
    runner = build_runner(
        RunnerConfig(str(tiny_qwen2), device="cuda", dtype="float32", max_running_requests=8, context_length=256)
    )
    assert isinstance(runner, GraphModelRunner)
    engine = Engine(runner)
    engine.start()
    try:
        rows = [
            (prompt, SamplingParams(temperature=0.0, max_new_tokens=10 + 7 * i, ignore_eos=True))
            for i, prompt in enumerate(PROMPTS)
        ]
        outputs = [seq.output_ids for seq in _finished(engine, rows, "g")]
    finally:
        engine.shutdown()
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).cuda().eval()
    for i, (prompt, out) in enumerate(zip(PROMPTS, outputs)):
        with torch.no_grad():
            want = reference.generate(
                torch.tensor([prompt], device="cuda"),
                max_new_tokens=10 + 7 * i,
                min_new_tokens=10 + 7 * i,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert out == want[0, len(prompt) :].tolist()


def test_sampling_never_waits_for_the_device() -> None:
    """Greedy, temperature, filtered and seeded rows in one batch, the sampling table's copy
    included: no host-device synchronisation, so the overlapped engine can queue a step's sampling
    and go on."""
    from areal_tasks.inference.server.sampling import SamplingBatch, make_generator, sample

    device = torch.device("cuda")
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=50, min_p=0.01),
        SamplingParams(temperature=1.0),
    ]
    generators = [None, None, None, make_generator(7, device)]
    logits = torch.randn(len(params), 151936, device=device)
    SamplingBatch.build(params, generators, device)  # the first pinned host block is allocated here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch = SamplingBatch.build(params, generators, device)
        tokens, logprobs = sample(logits, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(tokens[0]) == int(logits[0].argmax())
    assert bool((logprobs <= 0).all())


def test_compiled_greedy_reads_bf16_logits_without_waiting() -> None:
    """The CUDA-graph runner's compiled greedy pick: equal to the eager one on bf16 logits of the
    0.5B vocabulary, and no host-device synchronisation either: not even a compilation, since the
    warm-up compiled for the engine thread's inference mode."""
    from areal_tasks.inference.server.greedy import GreedyPicker, greedy_pick

    device = torch.device("cuda")
    picker = GreedyPicker(compiled=True)
    picker.warm_up(151936, torch.bfloat16, device)
    with torch.inference_mode():  # as the engine thread picks: the warm-up compiled for this mode only
        logits = (4 * torch.randn(256, 151936, device=device)).to(torch.bfloat16)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # a compilation would synchronise too
        try:
            tokens, logprobs = picker(logits)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    want_tokens, want_logprobs = greedy_pick(logits)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(logprobs, want_logprobs, rtol=0, atol=1e-4)


def test_overlapped_engine_on_graphs_equals_step_by_step(tiny_qwen2: Path) -> None:
    """The overlapped loop (device tokens carried into the captured graphs' inputs) and the
    step-by-step loop give the same greedy sequences, including one stopped by a stop token."""
    runner = build_runner(
        RunnerConfig(str(tiny_qwen2), device="cuda", dtype="float32", max_running_requests=8, context_length=256)
    )

    def run(overlap: bool, stop: int | None) -> list[list[int]]:
        engine = Engine(runner, overlap=overlap)
        engine.start()
        try:
            rows = [
                (
                    prompt,
                    SamplingParams(
                        temperature=0.0,
                        max_new_tokens=10 + 17 * i,
                        ignore_eos=True,
                        stop_token_ids=frozenset([stop] if stop is not None and i == 2 else []),
                    ),
                )
                for i, prompt in enumerate(PROMPTS)
            ]
            return [seq.output_ids for seq in _finished(engine, rows, "o")]
        finally:
            engine.shutdown()

    stop = run(False, None)[2][6]
    want = run(False, stop)
    assert run(True, stop) == want
    assert want[2][-1] == stop and len(want[2]) <= 7


def test_prefill_attention_never_uses_cudnn(tiny_qwen2: Path, monkeypatch) -> None:
    """Prefill shapes vary: its SDPA calls run with cuDNN (a plan built per new shape) switched off,
    and the global setting is untouched afterwards. In bf16, where SDPA would pick cuDNN, the decode
    graphs are still captured (their warm-up plans cuDNN outside the capture)."""
    graphs = GraphModelRunner(
        RunnerConfig(str(tiny_qwen2), device="cuda", dtype="bfloat16", max_running_requests=4, context_length=128)
    )
    assert graphs.capture
    del graphs
    runner = ModelRunner(
        RunnerConfig(str(tiny_qwen2), device="cuda", dtype="bfloat16", max_running_requests=4, context_length=128)
    )
    seen = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording_sdpa(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    enabled_before = torch.backends.cuda.cudnn_sdp_enabled()
    slots = [runner.cache.allocate() for _ in range(3)]
    runner.prefill_batch(slots, [[5, 6, 7], [8, 9], [10, 11, 12, 13]])
    runner.decode(slots, [1, 2, 3], [3, 2, 4])  # the eager decode's shapes vary too
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled() == enabled_before


def test_top_logprobs_never_wait_for_the_device() -> None:
    """Alternatives for some rows of a mixed batch (``top_logprobs.py``) and their queued read-back
    into a buffer sized for more rows (an engine's slots, most steps running fewer): no host-device
    synchronisation either, so the overlapped engine keeps its overlap."""
    from areal_tasks.inference.server.readback import ReadbackBuffer
    from areal_tasks.inference.server.sampling import SamplingBatch, sample
    from areal_tasks.inference.server.top_logprobs import top_logprobs

    device = torch.device("cuda")
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7), SamplingParams(temperature=0.0)]
    counts = [0, 5, 20]
    logits = torch.randn(len(params), 151936, device=device).to(torch.bfloat16)
    readback = ReadbackBuffer(64, device)
    SamplingBatch.build(params, [None] * 3, device, counts)  # the first pinned host blocks are allocated here
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        batch = SamplingBatch.build(params, [None] * 3, device, counts)
        tokens, logprobs = sample(logits, batch)
        logprobs, table = top_logprobs(logits, batch, tokens, logprobs)
        step = readback.start([], tokens, logprobs, batch.top, table)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    token_list, logprob_list = step.results()
    ids, values = step.top_results()
    assert len(ids) == 2 and len(ids[1]) == 20
    want = torch.log_softmax(logits[2].float(), -1).topk(20)
    assert [int(t) for t in ids[1]] == want.indices.tolist() and ids[1][0] == token_list[2]
    assert values[1] == pytest.approx(want.values.tolist(), abs=1e-5) and values[1][0] == logprob_list[2]


def test_graph_engine_top_logprobs_match_a_forward_pass(tiny_qwen2: Path) -> None:
    """The engine on the CUDA-graph runner, overlapped: rows asking for alternatives (greedy and
    sampled) decoded with one that does not; the alternatives equal a transformers forward's top k
    and the row without them gives the tokens it gives alone."""
    runner = build_runner(
        RunnerConfig(str(tiny_qwen2), device="cuda", dtype="float32", max_running_requests=8, context_length=256)
    )
    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32).cuda().eval()
    engine = Engine(runner)
    engine.start()
    try:

        def run(specs: list[tuple[list[int], float, int]]) -> list[Sequence]:
            rows = [
                (prompt, SamplingParams(temperature=temperature, max_new_tokens=20, ignore_eos=True, sampling_seed=i))
                for i, (prompt, temperature, _) in enumerate(specs)
            ]
            return _finished(engine, rows, f"t{len(specs)}-", [k for _, _, k in specs])

        specs = [(PROMPTS[0], 0.0, 3), (PROMPTS[1], 0.8, 5), (PROMPTS[2], 0.0, 0)]
        done = run(specs)
        alone = run([specs[2]])[0]
    finally:
        engine.shutdown()
    assert alone.output_ids == done[2].output_ids and done[2].output_top_logprobs == []
    for seq, (prompt, temperature, k) in zip(done[:2], specs):
        with torch.no_grad():
            ids = torch.tensor([prompt + seq.output_ids], device="cuda")
            logits = reference(ids).logits[0, len(prompt) - 1 : -1].double()
        want = torch.log_softmax(logits / (temperature or 1.0), -1).cpu()
        assert len(seq.output_top_logprobs) == len(seq.output_ids)
        for position, entry in zip(want, seq.output_top_logprobs):
            values = [v for _, v in entry]
            assert len(entry) == k
            assert values == pytest.approx(position[[t for t, _ in entry]].tolist(), abs=1e-4)
            assert values == pytest.approx(position.topk(k).values.tolist(), abs=1e-4)
        for token, logprob, entry in zip(seq.output_ids, seq.output_logprobs, seq.output_top_logprobs):
            if token in dict(entry):
                assert dict(entry)[token] == logprob


def test_a_decode_step_is_queued_without_waiting_for_the_device(tiny_qwen2: Path, monkeypatch) -> None:
    """In the server's engine (bf16 captured graphs, compiled greedy pick, the Triton sampler), a
    decode step's launch, sampling table, sampling, alternatives and read-back copy never
    synchronise with the device, on steps of changing and of steady rows, greedy, sampled, seeded
    and with alternatives in one batch: only the collect of the step before waits (an event).
    A hidden synchronisation there serialises the host's work with the device's."""
    from areal_tasks.inference.server import decode_step

    runner = build_runner(
        RunnerConfig(str(tiny_qwen2), device="cuda", dtype="bfloat16", max_running_requests=8, context_length=256)
    )
    assert isinstance(runner, GraphModelRunner) and runner.capture
    engine = Engine(runner)

    def no_sync(fn):
        def guarded(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        return guarded

    specs = [  # (temperature, top_p, seed, alternatives, new tokens): rows finish at different steps
        (0.0, 1.0, None, 0, 40),
        (1.0, 0.9, None, 0, 33),
        (0.8, 1.0, 7, 0, 26),
        (0.0, 1.0, None, 3, 19),
        (1.0, 1.0, None, 0, 12),
    ]

    def run() -> list[Sequence]:
        rows = [
            (
                PROMPTS[i],
                SamplingParams(
                    temperature=temperature, top_p=top_p, sampling_seed=seed, max_new_tokens=new, ignore_eos=True
                ),
            )
            for i, (temperature, top_p, seed, _, new) in enumerate(specs)
        ]
        return _finished(engine, rows, "s", [spec[3] for spec in specs])

    engine.start()
    try:
        # a first run meets whatever a server meets on first use (a compilation syncs; the greedy
        # pick's used to, warmed up outside the engine thread's inference mode)
        run()
        for name in ("_launch", "_sampling_table"):
            monkeypatch.setattr(engine, name, no_sync(getattr(engine, name)))
        monkeypatch.setattr(engine._readback, "start", no_sync(engine._readback.start))
        monkeypatch.setattr(decode_step, "sample", no_sync(decode_step.sample))
        monkeypatch.setattr(decode_step, "top_logprobs", no_sync(decode_step.top_logprobs))
        done = run()
    finally:
        engine.shutdown()
    for seq, spec in zip(done, specs):
        assert seq.finish_reason == {"type": "length", "length": spec[4]}, seq.finish_reason
        assert len(seq.output_ids) == spec[4]
