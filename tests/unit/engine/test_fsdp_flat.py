"""``fsdp_wrap="none"``: on one rank the engine keeps its own flat fp32 masters and gradients and a
compute-dtype copy (``engine/fsdp/flat_params.py``) instead of wrapping the model in FSDP.

On a world of one (CPU) it trains exactly as the one-unit FSDP layout does: fp32 gradients, two
clipped AdamW steps, the forward after them and the exported weights are bit for bit the same, and
with a bf16 compute copy the same within bf16 rounding. Micro-batches add up in fp32; a DCP
checkpoint taken with it restores into a fresh engine and continues identically; a critic works;
and what it cannot hold (several shard ranks, LoRA) is refused by name.
"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.config.engine import EngineConfig, LoRAConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.build import resolve_fsdp_wrap
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.fsdp.export import iter_full_tensors
from areal_tasks.engine.fsdp.flat_params import FlatParams
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.errors import EngineError


def policy_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    mask = mb["loss_mask"].float()
    key = "values" if "values" in outputs else "logprobs"
    return -(outputs[key] * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1.0), {}


def weight(mb: dict) -> float:
    return float(mb["loss_mask"].sum())


def engine(model_dir: str, wrap: str, *, dtype: str = "auto", **overrides) -> FSDPEngine:
    config = EngineConfig(
        optimizer=OptimizerConfig(lr=1e-3, grad_clip=0.5),
        micro_batch=MicroBatchSpec(n_mbs=2),
        fsdp_wrap=wrap,
        dtype=dtype,
        **overrides,
    )
    built = FSDPEngine(config, model_dir, parallel=ParallelDims(dp=1), total_steps=4)
    built.initialize()
    return built


def run(model_dir: str, wrap: str, packed_batch, **kwargs) -> dict:
    """Gradients of one batch, two training steps, then a forward and the exported weights."""
    e = engine(model_dir, wrap, **kwargs)
    e.accumulate_gradients(packed_batch(0), policy_loss, weight)
    grads = e.full_gradients()
    e.zero_grad()
    losses = [e.train_batch(packed_batch(seed), policy_loss, weight)["loss"] for seed in (1, 2)]
    forward = e.forward_batch(packed_batch(3), with_entropy=True)
    weights = {k: v.clone() for k, v in iter_full_tensors(e.model, e.device)}
    result = {
        "grads": grads,
        "losses": losses,
        "forward": forward,
        "weights": weights,
        "kernels": e.kernels,
        "types": {type(p) for p in e.model.parameters()},
    }
    e.destroy()
    return result


@pytest.mark.parametrize("checkpointing", [False, True])  # recomputed blocks still see the compute copy
def test_no_fsdp_trains_bit_for_bit_like_one_fsdp_unit(tiny_qwen2, world_of_one, packed_batch, checkpointing) -> None:
    fsdp = run(str(tiny_qwen2), "root", packed_batch, gradient_checkpointing=checkpointing)
    flat = run(str(tiny_qwen2), "none", packed_batch, gradient_checkpointing=checkpointing)
    assert flat["kernels"]["fsdp_wrap"] == "none" and flat["types"] == {torch.nn.Parameter}
    assert flat["losses"] == fsdp["losses"]
    for key in ("grads", "forward", "weights"):
        assert flat[key].keys() == fsdp[key].keys()
        for name, tensor in flat[key].items():
            torch.testing.assert_close(tensor, fsdp[key][name], atol=0, rtol=0, msg=f"{key} {name}")


def test_a_bf16_compute_copy_matches_fsdp_mixed_precision(tiny_qwen2, world_of_one, packed_batch) -> None:
    fsdp = run(str(tiny_qwen2), "root", packed_batch, dtype="bfloat16")
    flat = run(str(tiny_qwen2), "none", packed_batch, dtype="bfloat16")
    assert flat["losses"] == pytest.approx(fsdp["losses"], rel=1e-3)
    for name, grad in flat["grads"].items():
        assert grad.dtype == torch.float32  # fp32 master gradients
        torch.testing.assert_close(grad, fsdp["grads"][name], atol=2e-3, rtol=2e-2, msg=name)
    for name, value in flat["weights"].items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, fsdp["weights"][name], atol=1e-4, rtol=1e-4, msg=name)


def test_micro_batches_add_up_in_fp32_and_modules_get_the_masters_back(tiny_model_factory) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_factory("qwen2", tie_word_embeddings=True), dtype=torch.float32
    )
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    flat = FlatParams(model, torch.bfloat16)
    assert tied and model.lm_head.weight is model.get_input_embeddings().weight
    assert all(p.data_ptr() >= flat.master.data_ptr() for p in model.parameters())
    ids = torch.randint(0, 100, (1, 12))
    for _ in range(2):
        with flat.computing():
            assert model.lm_head.weight is model.get_input_embeddings().weight  # one compute parameter
            assert model.lm_head.weight.dtype == torch.bfloat16
            model(input_ids=ids).logits.float().square().mean().backward()
        flat.accumulate()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert all(p.grad is None for p in flat.compute_params) and flat.master_grad.any()
    accumulated = flat.master_grad.clone()
    flat.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    with flat.computing():  # after zero_grad the next accumulation starts afresh
        model(input_ids=ids).logits.float().square().mean().backward()
    flat.accumulate()
    torch.testing.assert_close(flat.master_grad, accumulated / 2, atol=1e-6, rtol=1e-3)
    with pytest.raises(RuntimeError, match="cut short"), flat.computing():
        model(input_ids=ids).logits.float().square().mean().backward()
        raise RuntimeError("a step cut short after its backward")
    assert all(p.grad is None for p in flat.compute_params)  # nothing half-accumulated leaks into the next step
    with pytest.raises(EngineError, match="not reentrant"), flat.computing(), flat.computing():
        pass
    assert model.lm_head.weight.dtype == torch.float32  # restored after the error too


def test_checkpoint_restores_and_continues_identically(tiny_qwen2, world_of_one, packed_batch, tmp_path) -> None:
    first = engine(str(tiny_qwen2), "none")
    first.train_batch(packed_batch(1), policy_loss, weight)
    first.save(str(tmp_path / "ckpt"), "dcp")
    want = first.train_batch(packed_batch(2), policy_loss, weight)
    want_weights = {k: v.clone() for k, v in iter_full_tensors(first.model, first.device)}
    first.destroy()
    second = engine(str(tiny_qwen2), "none")
    second.load(str(tmp_path / "ckpt"), "dcp")
    got = second.train_batch(packed_batch(2), policy_loss, weight)
    assert got["loss"] == want["loss"] and got["grad_norm"] == want["grad_norm"]
    for name, value in iter_full_tensors(second.model, second.device):
        torch.testing.assert_close(value, want_weights[name], atol=0, rtol=0, msg=name)
    second.destroy()


def test_a_critic_trains_without_fsdp(tiny_qwen2, world_of_one, packed_batch) -> None:
    fsdp = run(str(tiny_qwen2), "root", packed_batch, value_head=True)
    flat = run(str(tiny_qwen2), "none", packed_batch, value_head=True)
    assert flat["losses"] == fsdp["losses"]


def test_what_it_cannot_hold_is_refused_by_name(tiny_qwen2, world_of_one) -> None:
    with pytest.raises(EngineError, match="shard group .* has 2 ranks"):
        resolve_fsdp_wrap("none", 2)
    assert resolve_fsdp_wrap("none", 1) == "none"
    with pytest.raises(EngineError, match="fsdp_wrap=none does not support LoRA"):
        engine(str(tiny_qwen2), "none", lora=LoRAConfig(enabled=True))


@pytest.mark.parametrize("fused", [False, True])
def test_a_non_finite_gradient_skips_the_step_and_a_finite_one_takes_it(
    tiny_qwen2, world_of_one, packed_batch, fused
) -> None:
    """Fused AdamW over the flat buffers (as on a GPU) decides the skip on the device from its
    ``found_inf`` flag and reads nothing back before the step is queued; the unfused optimizer
    decides on the host. Either way a NaN gradient leaves weights, optimizer state and step count
    as they were, and the next finite batch trains."""
    from areal_tasks.engine.fsdp.optim import build_lr_scheduler, build_optimizer

    e = engine(str(tiny_qwen2), "none")
    e.optimizer = build_optimizer(e.params, e.config.optimizer, fused=fused)
    e.lr_scheduler = build_lr_scheduler(e.optimizer, e.config.lr_schedule, 4)
    assert e._skips_on_device is fused
    e.train_batch(packed_batch(1), policy_loss, weight)
    before = {k: v.clone() for k, v in iter_full_tensors(e.model, e.device)}
    state = {k: v.clone() for k, v in e.optimizer.state[e.params[0]].items()}

    def nan_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
        loss, stats = policy_loss(outputs, mb)
        return loss * float("nan"), stats

    stats = e.train_batch(packed_batch(2), nan_loss, weight)
    assert stats["update_skipped"] == 1.0 and not torch.isfinite(torch.tensor(stats["grad_norm"]))
    for name, value in iter_full_tensors(e.model, e.device):
        assert torch.equal(value, before[name]), name
    for key, value in e.optimizer.state[e.params[0]].items():
        assert torch.equal(value, state[key]), key
    assert not hasattr(e.optimizer, "found_inf")
    stats = e.train_batch(packed_batch(2), policy_loss, weight)
    assert stats["update_skipped"] == 0.0 and stats["grad_norm"] > 0
    assert float(e.optimizer.state[e.params[0]]["step"]) == float(state["step"]) + 1
    changed = [name for name, value in iter_full_tensors(e.model, e.device) if not torch.equal(value, before[name])]
    assert changed
    assert not hasattr(e.optimizer, "grad_scale")


def test_the_fused_step_clips_inside_the_update_like_clipping_first(tiny_qwen2, world_of_one, packed_batch) -> None:
    """The device path divides the gradients by the inverse clipping factor inside the fused
    update; from the same start it trains like clipping the gradients first and stepping (the
    clip is active: grad_clip 0.5 is below these gradients' norm)."""
    from areal_tasks.engine.fsdp.optim import build_optimizer

    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        e = engine(str(tiny_qwen2), "none")
        e.optimizer = build_optimizer(e.params, e.config.optimizer, fused=fused)
        stats = [e.train_batch(packed_batch(seed), policy_loss, weight) for seed in (1, 2)]
        results.append((stats, {k: v.clone() for k, v in iter_full_tensors(e.model, e.device)}))
        e.destroy()
    (host_stats, host_weights), (device_stats, device_weights) = results
    assert all(s["grad_norm"] > 0.5 for s in host_stats)
    for host, device in zip(host_stats, device_stats):
        assert device["grad_norm"] == pytest.approx(host["grad_norm"], rel=1e-5)
        assert device["loss"] == pytest.approx(host["loss"], rel=1e-5)
    for name, value in device_weights.items():
        torch.testing.assert_close(value, host_weights[name], atol=1e-6, rtol=1e-5, msg=name)
