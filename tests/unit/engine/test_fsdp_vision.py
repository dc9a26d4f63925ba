"""The FSDP engine trains vision-language models (tiny Qwen2-VL and Qwen2.5-VL) on packed batches:
log-probs equal transformers' forward of each sequence alone, the gradients and one clipped AdamW
step equal transformers' own ``loss.backward()`` and step (the vision tower's included), and the
weights it publishes carry the names of the server's model class (and load into it).

One rank (a gloo group of one), fp32 on CPU; the batch holds two sequences with images (two images
of different sizes, one image) and a text-only one, split into two micro-batches.
"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.config.engine import EngineConfig, LRScheduleConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.vision import vision_tower_trains
from areal_tasks.errors import EngineError
from tests.unit.engine.vision_helpers import (
    load_reference,
    reference_logprobs,
    token_mean_loss,
    token_weight,
    vision_batch,
)

FAMILIES = ["qwen2_vl", "qwen2_5_vl"]


@pytest.fixture(params=FAMILIES)
def vlm_dir(request, tiny_model_factory):
    return tiny_model_factory(request.param)


def _engine(model_dir, **optimizer) -> FSDPEngine:
    config = EngineConfig(
        optimizer=OptimizerConfig(**optimizer),
        lr_schedule=LRScheduleConfig(type="constant"),
        micro_batch=MicroBatchSpec(n_mbs=2),
    )
    engine = FSDPEngine(config, str(model_dir))
    engine.initialize()
    return engine


def _params(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in engine.iter_weights()}


def test_packed_logprobs_equal_transformers_per_sequence(vlm_dir, world_of_one):
    batch = vision_batch(seed=1)
    engine = _engine(vlm_dir)
    assert engine.vision is not None and engine.kernels["attention"] == "areal_varlen"
    out = engine.forward_batch(batch, with_entropy=True)
    with torch.no_grad():
        expected = reference_logprobs(load_reference(vlm_dir), batch)
    torch.testing.assert_close(out["logprobs"], expected, atol=1e-5, rtol=1e-5)
    # the images matter: other pixels change the scores of the tokens after them
    other = dict(batch, pixel_values=torch.randn_like(batch["pixel_values"]))
    assert (engine.forward_batch(other)["logprobs"] - out["logprobs"]).abs().max() > 1e-4


def test_one_step_equals_transformers_backward_and_adamw(vlm_dir, world_of_one):
    batch = vision_batch(seed=2)
    settings = {"lr": 1e-3, "weight_decay": 0.01, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "grad_clip": 0.5}
    engine = _engine(vlm_dir, **settings)
    assert vision_tower_trains(engine.model)
    before = _params(engine)
    engine.accumulate_gradients(batch, token_mean_loss, token_weight)
    grads = engine.full_gradients()
    stats = engine.train_batch(batch, token_mean_loss, token_weight)
    after = _params(engine)

    model = load_reference(vlm_dir)
    loss, _ = token_mean_loss({"logprobs": reference_logprobs(model, batch)}, batch)
    loss.backward()
    assert grads.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings["grad_clip"])
    torch.optim.AdamW(
        model.parameters(),
        lr=settings["lr"],
        betas=(settings["beta1"], settings["beta2"]),
        eps=settings["eps"],
        weight_decay=settings["weight_decay"],
    ).step()
    expected = {name: p.detach() for name, p in model.named_parameters()}

    assert stats["loss"] == pytest.approx(float(loss.detach()), abs=1e-5)
    assert stats["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
    assert after.keys() == expected.keys()
    for name, tensor in after.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    # the vision tower trained too
    moved = [n for n in after if n.startswith("model.visual.") and (after[n] - before[n]).abs().max() > 1e-4]
    assert moved, "no vision-tower parameter changed in the step"


def test_freeze_vision_trains_the_language_model_only(tiny_qwen2_vl, tiny_qwen2, world_of_one):
    config = EngineConfig(
        optimizer=OptimizerConfig(lr=1e-2),
        lr_schedule=LRScheduleConfig(type="constant"),
        micro_batch=MicroBatchSpec(n_mbs=2),
        freeze_vision=True,
    )
    engine = FSDPEngine(config, str(tiny_qwen2_vl))
    engine.initialize()
    assert not vision_tower_trains(engine.model)
    before = _params(engine)
    batch = vision_batch(seed=3)
    engine.train_batch(batch, token_mean_loss, token_weight)
    after = _params(engine)
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    assert changed and not any(n.startswith("model.visual.") for n in changed)
    assert any(n.startswith("model.language_model.") for n in changed)
    with pytest.raises(EngineError, match="no vision tower"):
        FSDPEngine(config, str(tiny_qwen2)).initialize()


def test_published_weights_load_into_the_servers_model_class(vlm_dir, world_of_one, tmp_path):
    """``weight_specs``/``iter_weights`` name every tensor as ``Qwen2VLForConditionalGeneration``
    (or 2.5) names its own, the inference server's model runner loads them as a weight update, and
    an HF save loads back with ``from_pretrained`` unchanged."""
    engine = _engine(vlm_dir, lr=1e-2)
    engine.train_batch(vision_batch(seed=3), token_mean_loss, token_weight)
    published = dict(engine.iter_weights())
    model = load_reference(vlm_dir)
    assert [spec.name for spec in engine.weight_specs()] == list(published)
    assert published.keys() == model.state_dict().keys()
    assert any(name.startswith("model.visual.") for name in published)
    model.load_state_dict(published, strict=True)
    # the system's own inference server takes them as a weight update
    from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig

    runner = ModelRunner(RunnerConfig(model_path=str(vlm_dir), device="cpu", max_running_requests=1, context_length=64))
    specs = runner.weight_specs()
    assert runner.required_weight_names() <= published.keys() <= specs.keys()
    assert all(specs[name][0] == tuple(tensor.shape) for name, tensor in published.items())
    assert runner.load_weights(published.items()) == len(published)
    served = dict(runner.model.named_parameters())
    assert all(torch.equal(served[name], published[name]) for name in runner.required_weight_names())
    engine.save(str(tmp_path / "hf"), "hf")
    reloaded = load_reference(tmp_path / "hf").state_dict()
    assert reloaded.keys() == published.keys()
    for name, tensor in published.items():
        torch.testing.assert_close(reloaded[name], tensor, atol=0, rtol=0, msg=name)


def test_lora_adapts_the_language_model_only_and_steps_like_peft(tiny_qwen2_5_vl, world_of_one):
    """LoRA's default adapters sit in the language model (Qwen2.5-VL's vision blocks have MLP
    projections of the same names, left frozen); one step publishes what a peft-wrapped
    transformers model merges after the same step."""
    from areal_tasks.config.engine import LoRAConfig
    from areal_tasks.models.lora import LoraMerger, apply_lora, lora_scalings

    lora = LoRAConfig(enabled=True, rank=4, alpha=8.0)
    config = EngineConfig(
        optimizer=OptimizerConfig(lr=1e-2, grad_clip=0.0),
        lr_schedule=LRScheduleConfig(type="constant"),
        micro_batch=MicroBatchSpec(n_mbs=2),
        lora=lora,
    )
    engine = FSDPEngine(config, str(tiny_qwen2_5_vl), seed=3)
    engine.initialize()
    trained = [n for n, p in engine.model.named_parameters() if p.requires_grad]
    assert trained and all(".language_model." in n and ".lora_" in n for n in trained)
    assert not vision_tower_trains(engine.model)  # no dummy images needed on several ranks
    batch = vision_batch(seed=5)
    engine.train_batch(batch, token_mean_loss, token_weight)
    published = dict(engine.iter_weights())

    model = apply_lora(load_reference(tiny_qwen2_5_vl), lora, seed=3)
    loss, _ = token_mean_loss({"logprobs": reference_logprobs(model, batch)}, batch)
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01).step()
    expected = dict(LoraMerger(lora_scalings(model))(model.state_dict().items()))
    assert published.keys() == expected.keys()
    for name, tensor in published.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    base = load_reference(tiny_qwen2_5_vl).state_dict()
    changed = [n for n in published if (published[n] - base[n]).abs().max() > 0]
    assert changed and all(".language_model." in n for n in changed)


def test_the_chunked_lm_head_scores_a_vlm_as_the_full_logits_do(tiny_qwen2_vl, world_of_one, monkeypatch):
    """The VL families are not marked ``plain_lm_head`` (``models/families.py``); marked, the engine
    installs the chunked fused head, whose log-probs, entropy and gradients equal the full logits'."""
    import areal_tasks.kernels.lm_head as lm_head

    monkeypatch.setattr(lm_head, "PLAIN_HEAD_FAMILIES", (*lm_head.PLAIN_HEAD_FAMILIES, "qwen2_vl"))
    batch = vision_batch(seed=6)
    results = {}
    for chunked in (True, False):
        engine = FSDPEngine(
            EngineConfig(micro_batch=MicroBatchSpec(n_mbs=2)), str(tiny_qwen2_vl), chunked_lm_head=chunked
        )
        engine.initialize()
        assert engine.kernels["lm_head"].startswith("chunked") == chunked
        out = engine.forward_batch(batch, with_entropy=True)
        engine.accumulate_gradients(batch, token_mean_loss, token_weight)
        results[chunked] = (out, engine.full_gradients())
    (chunked_out, chunked_grads), (full_out, full_grads) = results[True], results[False]
    for key in ("logprobs", "entropy"):
        torch.testing.assert_close(chunked_out[key], full_out[key], atol=1e-6, rtol=1e-5)
    assert chunked_grads.keys() == full_grads.keys()
    for name, grad in chunked_grads.items():
        torch.testing.assert_close(grad, full_grads[name], atol=1e-6, rtol=1e-4)


def test_the_memory_budget_counts_the_vision_tower(tiny_qwen2_vl, world_of_one):
    """``micro_batch.memory_budget_gb``: the language model's estimate plus the vision tower's
    parameters, gradients and AdamW state leave fewer tokens per micro-batch than the text alone."""
    from areal_tasks.engine.vision import with_vision_tower
    from areal_tasks.models.memory import GIB, estimate_memory, max_tokens_for_budget

    budget_gb = 2.0  # room beyond the chunked LM head's fixed workspace
    config = EngineConfig(micro_batch=MicroBatchSpec(memory_budget_gb=budget_gb, pad_to_multiple_of=8))
    engine = FSDPEngine(config, str(tiny_qwen2_vl))
    engine.initialize()
    head = engine.lm_head  # the chunked LM head's workspace is part of the estimate
    text = estimate_memory(
        engine.hf_config(),
        param_dtype="float32",
        dp=1,
        tp=1,
        sp=1,
        fsdp_wrap="root",
        ce_chunk_tokens=head.chunk if head is not None else None,
        ce_keep_logits=head is not None and head.keep_logits,
    )
    full = with_vision_tower(text, engine.model)
    n_tower = sum(p.numel() for p in engine.model.model.visual.parameters())
    assert full.num_params == text.num_params + n_tower == sum(p.numel() for p in engine.model.parameters())
    assert full.static_bytes > text.static_bytes
    budget = int(budget_gb * GIB)
    assert engine.mb_spec.max_tokens_per_mb == max_tokens_for_budget(full, budget, multiple=8)
    assert engine.mb_spec.max_tokens_per_mb < max_tokens_for_budget(text, budget, multiple=8)
