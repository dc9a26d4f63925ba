"""The ``vision`` workflow against a scripted engine and the tiny Qwen2-VL's processor: the request
carries the expanded prompt and the image as base64 PNG, the trajectory the processor's pixel inputs;
a generated image placeholder ends the output; text items go as ``rlvr`` sends them."""

from __future__ import annotations

import asyncio
import base64
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from areal_tasks.api.inference import ModelResponse, SamplingParams
from areal_tasks.config.rollout import WorkflowConfig
from areal_tasks.datasets.prompts import render_prompt
from areal_tasks.datasets.registry import Record, load_records
from areal_tasks.datasets.vision_prompts import load_processor
from areal_tasks.errors import ConfigError
from areal_tasks.models.tiny.vision_kit import VISION_IDS
from areal_tasks.models.tokenizer import load_tokenizer
from areal_tasks.rollout.workflows import RLVRWorkflow, build_workflow, workflow_problems
from areal_tasks.rollout.workflows.vision import VisionRLVRWorkflow, cut_at_placeholders
from tests.unit.rollout.workflow_fakes import FakeEngine, Reply, arith_reward, generated

PAD = VISION_IDS["<|image_pad|>"]
SAMPLING = SamplingParams(max_new_tokens=8)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2_vl: Path) -> Any:
    return load_tokenizer(str(tiny_qwen2_vl))


@pytest.fixture(scope="module")
def records() -> list[Record]:
    return load_records("demo:shapes?kind=count&n_train=4&n_eval=2&seed=1", "train")


def run(workflow: VisionRLVRWorkflow, engine: FakeEngine, item: Any) -> Any:
    return asyncio.run(workflow.arun_episode(engine, item))


def test_an_image_prompt_is_sent_expanded_with_its_image_and_trained_with_its_pixels(tokenizer, records) -> None:
    record = records[0]
    workflow = build_workflow(WorkflowConfig(name="vision"), tokenizer, SAMPLING, arith_reward, max_prompt_len=96)
    assert isinstance(workflow, VisionRLVRWorkflow)
    engine = FakeEngine(tokenizer, [Reply(f"Answer: {record.answer}")])
    traj = run(workflow, engine, record)

    (request,) = engine.requests
    assert request.input_ids.count(PAD) == 16 and request.input_ids == traj.input_ids[: traj.prompt_len]
    (sent,) = request.image_data
    image = Image.open(io.BytesIO(base64.b64decode(sent)))
    assert image.format == "PNG" and image.convert("RGB").tobytes() == record.images[0].tobytes()
    text = tokenizer.decode(request.input_ids)
    assert "<|vision_start|>" + "<|image_pad|>" * 16 + "<|vision_end|>How many shapes are in the image?" in text
    # the trajectory: generated tokens trained with the engine's logprobs, the processor's pixels
    assert generated(traj.input_ids, traj.loss_mask) == engine.responses[0].output_ids
    assert generated(traj.logprobs, traj.loss_mask) == engine.responses[0].output_logprobs
    assert traj.reward == 1.0 and traj.metadata["n_images"] == 1 and not traj.metadata["cut_at_placeholder"]
    pixel_values, grid = load_processor(tokenizer).pixels(record.images)
    assert set(traj.multimodal) == {"pixel_values", "image_grid_thw"}
    assert torch.equal(traj.multimodal["pixel_values"], pixel_values)
    assert traj.multimodal["image_grid_thw"].tolist() == grid.tolist() == [[1, 8, 8]]
    assert workflow.render_item(record) == request.input_ids  # what max_prompt_len counts


def test_a_groups_episodes_render_their_record_once(tokenizer, records, monkeypatch) -> None:
    """A GRPO group's episodes share one record: it is rendered (processor, PNG) once, each
    trajectory still gets a multimodal dict of its own; another record object, even an equal one,
    and an item that is no record are rendered again."""
    import dataclasses

    from areal_tasks.rollout.workflows import vision

    workflow = VisionRLVRWorkflow(tokenizer, SAMPLING, arith_reward)
    calls: list[Any] = []
    real = workflow._render
    monkeypatch.setattr(workflow, "_render", lambda data: calls.append(data) or real(data))
    engine = FakeEngine(tokenizer, [Reply("Answer: 2")])
    group = [run(workflow, engine, records[0]) for _ in range(4)]
    assert len(calls) == 1 and len(engine.requests) == 4
    assert all(
        r.input_ids == engine.requests[0].input_ids and r.image_data == engine.requests[0].image_data
        for r in engine.requests
    )
    assert len({id(t.multimodal) for t in group}) == 4
    assert all(torch.equal(t.multimodal["pixel_values"], group[0].multimodal["pixel_values"]) for t in group)
    twin = dataclasses.replace(records[0])
    run(workflow, engine, twin)
    item = {"prompt": records[0].prompt, "answer": records[0].answer, "images": list(records[0].images)}
    run(workflow, engine, item)
    run(workflow, engine, item)
    assert len(calls) == 4
    monkeypatch.setattr(vision, "RENDER_MEMO", 2)  # the oldest record is dropped past the bound
    for record in records[1:4]:
        run(workflow, engine, record)
    run(workflow, engine, records[0])
    assert len(calls) == 8 and len(workflow._rendered) == 2


def test_the_render_memo_is_bounded_by_bytes_and_keeps_the_latest(tokenizer, records, monkeypatch) -> None:
    """Past ``RENDER_MEMO_BYTES`` of tensors and encoded images the oldest records go (the count
    bound aside); the record just rendered stays even when it alone is over the bound."""
    from areal_tasks.rollout.workflows import vision

    workflow = VisionRLVRWorkflow(tokenizer, SAMPLING, arith_reward)
    engine = FakeEngine(tokenizer, [Reply("Answer: 2")])
    run(workflow, engine, records[0])
    one = workflow._rendered_bytes
    assert one > 0 and one == next(iter(workflow._rendered.values()))[1].nbytes
    monkeypatch.setattr(vision, "RENDER_MEMO_BYTES", 2 * one + one // 2)  # room for two of these
    for record in records[1:4]:
        run(workflow, engine, record)
    kept = [entry[0] for entry in workflow._rendered.values()]
    assert kept == list(records[2:4])
    assert workflow._rendered_bytes == sum(entry[1].nbytes for entry in workflow._rendered.values())
    monkeypatch.setattr(vision, "RENDER_MEMO_BYTES", 1)
    run(workflow, engine, records[0])
    assert [entry[0] for entry in workflow._rendered.values()] == [records[0]]
    assert workflow._rendered_bytes == one


def test_a_chat_item_and_a_mapping_item_get_their_images(tokenizer, records) -> None:
    workflow = VisionRLVRWorkflow(tokenizer, SAMPLING, arith_reward, system_prompt=None)
    chat = [{"role": "user", "content": [{"type": "text", "text": "Count."}, {"type": "image"}]}]
    item = {"prompt": "Count.", "answer": "2", "messages": chat, "images": list(records[1].images)}
    engine = FakeEngine(tokenizer, [Reply("Answer: 2")])
    traj = run(workflow, engine, item)
    text = tokenizer.decode(engine.requests[0].input_ids)
    assert text.startswith("<|im_start|>user\nCount.<|vision_start|>")  # the chat's own image part, no system
    assert traj.multimodal is not None and len(engine.requests[0].image_data) == 1


def test_a_generated_placeholder_ends_the_output(tokenizer, records) -> None:
    workflow = VisionRLVRWorkflow(tokenizer, SAMPLING, arith_reward)
    engine = FakeEngine(tokenizer, [Reply("Answer: 3<|image_pad|>Answer: 4", eos=False)])
    traj = run(workflow, engine, records[0])
    kept = generated(traj.input_ids, traj.loss_mask)
    assert PAD not in kept and tokenizer.decode(kept) == "Answer: 3"
    assert traj.input_ids.count(PAD) == 16  # only the prompt's image
    assert traj.metadata["cut_at_placeholder"] and traj.metadata["stop_reason"] == "length"
    assert traj.reward == float(records[0].answer == "3")
    # a placeholder as the very first token leaves nothing: rejected as an empty output
    first = FakeEngine(tokenizer, [Reply("<|image_pad|>Answer: 3")])
    assert run(workflow, first, records[0]) is None

    response = ModelResponse("r", [1], [5, PAD, 6], [-0.1, -0.2, -0.3], [2, 2, 3], "stop", 0.0, 0.0)
    cut = cut_at_placeholders(response, frozenset({PAD}))
    assert (cut.output_ids, cut.output_logprobs, cut.output_versions, cut.stop_reason) == ([5], [-0.1], [2], "length")
    assert cut_at_placeholders(response, frozenset({999})) is response


def test_text_items_go_as_rlvr_sends_them(tokenizer) -> None:
    record = Record("What is 2+3?", "5")
    vision = VisionRLVRWorkflow(tokenizer, SAMPLING, arith_reward)
    engine = FakeEngine(tokenizer, [Reply("Answer: 5")])
    traj = run(vision, engine, record)
    assert engine.requests[0].input_ids == render_prompt(tokenizer, record.prompt)
    assert engine.requests[0].image_data == () and traj.multimodal is None
    assert vision.render_item(record) == RLVRWorkflow(tokenizer, SAMPLING, arith_reward).render_item(record)


def test_too_long_prompts_are_rejected_before_any_request(tokenizer, records) -> None:
    workflow = VisionRLVRWorkflow(tokenizer, SAMPLING, arith_reward, max_prompt_len=40)  # the image alone is 18
    engine = FakeEngine(tokenizer, [Reply("Answer: 1")])
    assert run(workflow, engine, records[0]) is None and engine.requests == []


def test_the_processor_option_and_its_errors(tokenizer, records, tiny_qwen2_vl: Path, tiny_qwen2: Path) -> None:
    assert workflow_problems(WorkflowConfig(name="vision", options={"processor": str(tiny_qwen2_vl)})) == []
    assert workflow_problems(WorkflowConfig(name="vision", options={"processer": "x"}))  # a typo is a problem
    text_tokenizer = load_tokenizer(str(tiny_qwen2))
    # a text model's tokenizer with the VLM's processor directory named
    named = VisionRLVRWorkflow(text_tokenizer, SAMPLING, arith_reward, processor=str(tiny_qwen2_vl))
    assert named.render_item(records[0]).count(PAD) == 16
    # a processor passed as the tokenizer is used as is, its tokenizer renders text
    processor = load_processor(tokenizer)
    given = VisionRLVRWorkflow(processor, SAMPLING, arith_reward)
    assert given.processor is processor and given.tokenizer is processor.tokenizer
    # a text model cannot show images: a ConfigError naming the setting, at the first image item
    text_only = VisionRLVRWorkflow(text_tokenizer, SAMPLING, arith_reward)
    with pytest.raises(ConfigError, match="no image processor"):
        run(text_only, FakeEngine(text_tokenizer, [Reply("Answer: 1")]), records[0])
