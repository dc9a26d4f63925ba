"""The engine serving the tiny vision-language models (Qwen2-VL, Qwen2.5-VL) on the CPU: greedy
output ids and per-token log-probs equal transformers' for prompts with one and two images, alone,
as ``n > 1`` samples, and batched in decode with other image and text prompts; a prompt with
images prefilled again with its output (a retracted sequence) continues exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from server_helpers import generate, make_request
from vision_helpers import IMAGE_PAD, load_reference, png, prompt_with_images, reference_greedy

from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig

NEW_TOKENS = 6
#: log-probs agree to float32 rounding; a decode step without the rope delta is off by ~5e-4.
ATOL = 2e-5


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request: pytest.FixtureRequest, tiny_model_factory: Any, one_thread: None) -> Iterator[dict[str, Any]]:
    path = tiny_model_factory(request.param)
    runner = ModelRunner(RunnerConfig(str(path), device="cpu", max_running_requests=8, context_length=256))
    engine = Engine(runner)
    engine.start()
    yield {"runner": runner, "engine": engine, "reference": load_reference(path)}
    engine.shutdown()


def _check(vlm: dict[str, Any], seq: Any, ids: list[int], vision: Any) -> None:
    expected_ids, expected_logprobs = reference_greedy(vlm["reference"], ids, vision, NEW_TOKENS)
    assert seq.finish_reason["type"] in ("length", "stop"), seq.finish_reason
    assert seq.output_ids == expected_ids
    assert seq.output_logprobs == pytest.approx(expected_logprobs, abs=ATOL)


def _image_request(vlm: dict[str, Any], images: list[str], rid: str, n: int = 1) -> tuple[Any, list[int], Any]:
    ids, vision = vlm["runner"].vision.prepare(prompt_with_images(len(images)), images)
    req = make_request(ids, rid=rid, n=n, max_new_tokens=NEW_TOKENS, temperature=0.0)
    for seq in req.seqs:
        seq.group.vision = vision
    return req, ids, vision


@pytest.mark.parametrize("sizes", [[(40, 50)], [(64, 30), (33, 64)]], ids=["one-image", "two-images"])
def test_image_prompt_greedy_equals_transformers(vlm: dict[str, Any], sizes: list[tuple[int, int]]) -> None:
    images = [png(i, w, h) for i, (w, h) in enumerate(sizes)]
    req, ids, vision = _image_request(vlm, images, "img")
    assert vision.rope_delta < 0  # the images' tokens share rotary positions
    vlm["engine"].submit(req.seqs)
    _check(vlm, req.wait()[0], ids, vision)


def test_image_and_text_requests_decode_together(vlm: dict[str, Any]) -> None:
    runner, engine = vlm["runner"], vlm["engine"]
    requests = [_image_request(vlm, [png(10 + i, 32 + 16 * i, 64 - 8 * i)], f"img{i}") for i in range(3)]
    requests.append(_image_request(vlm, [png(20, 64, 64), png(21, 40, 32)], "img-two"))
    texts = [[40 + i, 41, 42, 43 + i] for i in range(2)]
    text_requests = [
        make_request(t, rid=f"txt{i}", max_new_tokens=NEW_TOKENS, temperature=0.0) for i, t in enumerate(texts)
    ]
    batch_sizes: list[int] = []
    decode = runner.decode

    def recording(slots: list[int], *args: Any, **kwargs: Any) -> torch.Tensor:
        batch_sizes.append(len(slots))
        return decode(slots, *args, **kwargs)

    runner.decode = recording  # type: ignore[method-assign]
    try:
        engine.submit([s for r, _, _ in requests for s in r.seqs] + [s for r in text_requests for s in r.seqs])
        finished = [r.wait()[0] for r, _, _ in requests] + [r.wait()[0] for r in text_requests]
    finally:
        del runner.decode
    assert max(batch_sizes) == 6  # all six were decoded in one step
    for seq, (_, ids, vision) in zip(finished, requests):
        _check(vlm, seq, ids, vision)
    for seq, ids in zip(finished[len(requests) :], texts):
        _check(vlm, seq, ids, None)


def test_image_prompt_samples_share_its_prefill(vlm: dict[str, Any]) -> None:
    req, ids, vision = _image_request(vlm, [png(3, 48, 48)], "n2", n=2)
    vlm["engine"].submit(req.seqs)
    for seq in req.wait():
        _check(vlm, seq, ids, vision)


def test_retracted_image_sequence_resumes_exactly(vlm: dict[str, Any]) -> None:
    """A sequence retracted by a pause with part of its output is prefilled again with it and its
    images (the engine's retract path) and ends as one uninterrupted run."""
    req, ids, vision = _image_request(vlm, [png(9, 64, 48)], "retracted")
    expected_ids, expected_logprobs = reference_greedy(vlm["reference"], ids, vision, NEW_TOKENS)
    (seq,) = req.seqs
    seq.output_ids, seq.output_logprobs = expected_ids[:3], expected_logprobs[:3]
    seq.retracted = True
    vlm["engine"].submit([seq])
    done = req.wait()[0]
    assert done.output_ids == expected_ids
    assert done.output_logprobs == pytest.approx(expected_logprobs, abs=ATOL)


def test_text_prompt_on_a_vision_model(vlm: dict[str, Any]) -> None:
    ids = [40, 41, 42, 43]
    _check(vlm, generate(vlm["engine"], ids, max_new_tokens=NEW_TOKENS, temperature=0.0), ids, None)


@torch.inference_mode()
def test_prefill_of_prompt_and_output_continues_the_decode(vlm: dict[str, Any]) -> None:
    """What a retracted sequence does: prompt + output prefilled again gives the decode's logits,
    also when the output holds an image pad (a text token there, which the tiny models do sample)."""
    runner = vlm["runner"]
    ids, vision = runner.vision.prepare(prompt_with_images(1), [png(5, 56, 40)])
    output = [45, IMAGE_PAD, 46]
    decoded, again = runner.cache.allocate(), runner.cache.allocate()
    try:
        runner.prefill(decoded, ids, vision=vision)
        for step, token in enumerate(output):
            logits = runner.decode([decoded], [token], [len(ids) + step], rope_deltas=[vision.rope_delta])[0]
        resumed = runner.prefill(again, ids + output, vision=vision)[-1]
    finally:
        runner.cache.release(decoded)
        runner.cache.release(again)
    torch.testing.assert_close(resumed, logits, atol=ATOL, rtol=0)
