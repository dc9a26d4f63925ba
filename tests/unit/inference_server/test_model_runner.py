"""The model runner on several architectures: greedy decoding of a ragged batch through the slot
cache equals ``transformers.generate`` per prompt; tied weights load under either name."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig
from areal_tasks.models import build_tiny_model
from areal_tasks.weights.base import ServedWeights
from areal_tasks.weights.disk import load_safetensors_dir

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [100, 200, 300, 400, 500, 600, 700]]
STEPS = 8


def _greedy_batch(runner: ModelRunner, prompts: list[list[int]], steps: int) -> list[list[int]]:
    slots = [runner.cache.allocate() for _ in prompts]
    outs = [[int(runner.prefill(slot, p)[-1].argmax())] for slot, p in zip(slots, prompts)]
    for _ in range(steps - 1):
        positions = [len(p) + len(o) - 1 for p, o in zip(prompts, outs)]
        logits = runner.decode(slots, [o[-1] for o in outs], positions)
        for out, row in zip(outs, logits):
            out.append(int(row.argmax()))
    for slot in slots:
        runner.cache.release(slot)
    return outs


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("llama", {}),
        ("qwen3", {}),
        ("gemma", {}),
        ("qwen2_moe", {}),
        ("mistral", {"sliding_window": 4}),
    ],
)
def test_ragged_batch_greedy_equals_generate(family: str, overrides: dict, one_thread: None) -> None:
    path = build_tiny_model(family, **overrides)
    runner = ModelRunner(RunnerConfig(str(path), device="cpu", max_running_requests=4, context_length=64))
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    got = _greedy_batch(runner, PROMPTS, STEPS)
    for prompt, out in zip(PROMPTS, got):
        with torch.no_grad():
            want = reference.generate(
                torch.tensor([prompt]),
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert out == want[0, len(prompt) :].tolist(), family


def test_tied_embeddings_load_under_either_name(one_thread: None) -> None:
    path = build_tiny_model("qwen2", tie_word_embeddings=True)
    runner = ModelRunner(RunnerConfig(str(path), device="cpu", max_running_requests=1, context_length=32))
    specs = runner.weight_specs()
    assert "lm_head.weight" in specs and "model.embed_tokens.weight" in specs
    assert "lm_head.weight" not in runner.required_weight_names()
    named = load_safetensors_dir(str(path), ServedWeights(specs, runner.required_weight_names()), runner.device)
    assert runner.load_weights(named.items()) == len(named)
    head = runner.model.get_output_embeddings().weight
    runner.load_weights([("lm_head.weight", torch.zeros_like(head))])
    assert not runner.model.get_input_embeddings().weight.any()


def test_batched_ragged_prefill_equals_single_prefills(runner) -> None:
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13], [100, 200, 300], [7] * 9]
    singles = []
    for prompt in prompts:
        slot = runner.cache.allocate()
        singles.append(runner.prefill(slot, prompt)[-1])
        runner.cache.release(slot)
    slots = [runner.cache.allocate() for _ in prompts]
    try:
        batched = runner.prefill_batch(slots, prompts)
        assert torch.allclose(batched, torch.stack(singles), atol=1e-5)
        assert [runner.cache.lengths[s] for s in slots] == [len(p) for p in prompts]
        # the cached keys continue correctly: one decode step equals a single-sequence prefill of T + 1
        nxt = [int(row.argmax()) for row in batched]
        stepped = runner.decode(slots, nxt, [len(p) for p in prompts])
    finally:
        for slot in slots:
            runner.cache.release(slot)
    for prompt, token, row in zip(prompts, nxt, stepped):
        slot = runner.cache.allocate()
        want = runner.prefill(slot, [*prompt, token])[-1]
        runner.cache.release(slot)
        assert torch.allclose(row, want, atol=1e-5)


def test_static_bucketed_decode_equals_eager_decode(tiny_qwen2, one_thread: None) -> None:
    """The CUDA-graph runner's static forward (run eagerly on CPU) gives the eager decode's logits."""
    from areal_tasks.inference.server.cuda_graph import GraphModelRunner, batch_buckets, length_buckets

    assert batch_buckets(256)[-4:] == [160, 192, 224, 256]
    assert batch_buckets(5) == [1, 2, 4, 5] and batch_buckets(700)[-2:] == [640, 700]
    assert length_buckets(392) == [256, 392] and length_buckets(48, smallest=16) == [16, 32, 48]
    static = GraphModelRunner(
        RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=6, context_length=48), capture=False
    )
    static.lengths = length_buckets(48, smallest=16)  # several length buckets within this short context
    eager = ModelRunner(RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=6, context_length=48))
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]
    got = _greedy_batch(static, prompts, 24)  # crosses the 16 and 32 length buckets
    assert got == _greedy_batch(eager, prompts, 24)
    slots = [static.cache.allocate() for _ in range(3)]
    eager_slots = [eager.cache.allocate() for _ in range(3)]
    for runner, taken in ((static, slots), (eager, eager_slots)):
        runner.prefill_batch(taken, prompts)
    step = static.decode(slots, [1, 2, 3], [3, 5, 1])
    assert torch.allclose(step, eager.decode(eager_slots, [1, 2, 3], [3, 5, 1]), atol=1e-5)
    assert [static.cache.lengths[s] for s in slots] == [4, 6, 2]


def _greedy_again(runner: ModelRunner, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """``_greedy_batch`` with every step after the first a :meth:`ModelRunner.decode_again` of
    the tokens sampled on the device (the overlapped engine's steady steps)."""
    slots = [runner.cache.allocate() for _ in prompts]
    outs = [[int(runner.prefill(slot, p)[-1].argmax())] for slot, p in zip(slots, prompts)]
    logits = runner.decode(slots, [o[-1] for o in outs], [len(p) for p in prompts])
    for step in range(steps - 1):
        tokens = logits.argmax(dim=-1)
        for out, token in zip(outs, tokens.tolist()):
            out.append(token)
        if step < steps - 2:
            logits = runner.decode_again(tokens)
    assert [runner.cache.lengths[s] for s in slots] == [len(p) + steps - 1 for p in prompts]
    for slot in slots:
        runner.cache.release(slot)
    return outs


def test_decode_again_continues_the_last_step(tiny_qwen2, one_thread: None) -> None:
    """Decoding the last step's rows again from their device tokens gives the host-fed decode's
    tokens on the eager runner and on the graph runner's static steps (across length buckets and
    with a padding row); after an eager step the graph runner takes the eager path again."""
    from areal_tasks.errors import InferenceError
    from areal_tasks.inference.server.cuda_graph import GraphModelRunner, length_buckets

    config = RunnerConfig(str(tiny_qwen2), device="cpu", max_running_requests=6, context_length=48)
    static = GraphModelRunner(config, capture=False)
    static.lengths = length_buckets(48, smallest=16)
    eager = ModelRunner(config)
    with pytest.raises(InferenceError, match="decode_again needs a decode call"):
        eager.decode_again(torch.zeros(1, dtype=torch.long))
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]  # 3 rows: the batch bucket of 4 pads one
    want = _greedy_batch(eager, prompts, 24)
    assert _greedy_again(eager, prompts, 24) == want
    assert _greedy_again(static, prompts, 24) == want
    assert static._static_step == (3, 4, 27)  # 3 rows padded to 4; the last step a static one at position 27
    # slots 1 and 2 (not 0..B-1): the eager decode; decode_again then follows it there
    slots = [static.cache.allocate() for _ in range(3)][1:]
    static.prefill_batch(slots, prompts[:2])
    first = static.decode(slots, [1, 2], [3, 5])
    assert static._static_step is None
    again = static.decode_again(first.argmax(dim=-1))
    eager_slots = [eager.cache.allocate() for _ in range(3)][1:]
    eager.prefill_batch(eager_slots, prompts[:2])
    eager.decode(eager_slots, [1, 2], [3, 5])
    assert torch.allclose(again, eager.decode(eager_slots, first.argmax(dim=-1).tolist(), [4, 6]), atol=1e-5)
    assert [static.cache.lengths[s] for s in slots] == [5, 7]
