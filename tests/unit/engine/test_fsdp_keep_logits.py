"""``EngineConfig.lm_head_keep_logits`` reaches the actor's chunked LM head, which then keeps each
micro-batch's logits for the backward: on a world of one (CPU, fp32) the engine's loss, statistics
and gradients are those of the recomputing head, and a forward-only engine keeps nothing."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.config.engine import EngineConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.parallel.mesh import ParallelDims


def policy_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    mask = mb["loss_mask"].float()
    loss = -(outputs["logprobs"] * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {"entropy": (outputs["entropy"].detach() * mask).sum() / mask.sum().clamp(min=1.0)}


def gradients(model_dir: str, keep: bool, packed_batch, *, trainable: bool = True) -> tuple[FSDPEngine, dict, dict]:
    config = EngineConfig(micro_batch=MicroBatchSpec(n_mbs=2), lm_head_keep_logits=keep)
    engine = FSDPEngine(config, model_dir, parallel=ParallelDims(dp=1), trainable=trainable, grad_entropy=True)
    engine.initialize()
    if not trainable:
        return engine, {}, {}
    stats = engine.accumulate_gradients(packed_batch(), policy_loss, lambda mb: float(mb["loss_mask"].sum()))
    return engine, stats, engine.full_gradients()


def test_kept_logits_train_like_recomputed_ones(tiny_qwen2, world_of_one, packed_batch) -> None:
    recomputing, want_stats, want = gradients(str(tiny_qwen2), False, packed_batch)
    keeping, stats, got = gradients(str(tiny_qwen2), True, packed_batch)
    assert keeping.lm_head is not None and keeping.lm_head.keep_logits
    assert "logits kept" in keeping.kernels["lm_head"] and "logits kept" not in recomputing.kernels["lm_head"]
    assert stats == pytest.approx(want_stats, rel=1e-6, abs=1e-7)
    assert got.keys() == want.keys() and got
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], atol=1e-6, rtol=1e-5, msg=name)
    frozen, _, _ = gradients(str(tiny_qwen2), True, packed_batch, trainable=False)
    assert not frozen.lm_head.keep_logits  # a reference model never runs a backward
    for engine in (recomputing, keeping, frozen):
        engine.destroy()


def test_auto_keeps_the_logits_of_a_capped_micro_batch_that_fits_the_gpu() -> None:
    from areal_tasks.kernels.lm_head import AUTO_KEEP_LOGITS_MAX_FRACTION, auto_keep_logits

    h200, rtx = 143_771_000_000, 24_000_000_000
    qwen = {"vocab_size": 151_936, "itemsize": 2}
    assert auto_keep_logits(token_cap=16_384, device_bytes=h200, **qwen)  # 5 GB: 3.5%
    assert not auto_keep_logits(token_cap=16_384, device_bytes=rtx, **qwen)  # 21%
    assert not auto_keep_logits(token_cap=None, device_bytes=h200, **qwen)  # micro-batches of any length
    assert not auto_keep_logits(token_cap=16_384, device_bytes=None, **qwen)  # the CPU
    edge = int(AUTO_KEEP_LOGITS_MAX_FRACTION * h200) // (151_936 * 2)
    assert auto_keep_logits(token_cap=edge, device_bytes=h200, **qwen)
    assert not auto_keep_logits(token_cap=edge + 1, device_bytes=h200, **qwen)


@pytest.mark.parametrize(
    ("cap", "budget", "gpu_bytes", "kept"),
    [
        (None, None, None, False),  # the CPU: nothing to size against
        (256, None, 10**12, True),  # an explicit cap whose logits fit
        (None, None, 10**12, False),  # no cap: a micro-batch may be any length
        (256, None, 10**4, False),  # too large a share of the device
        (None, 8.0, 10**12, False),  # a cap sized from the budget would shrink to make room
    ],
)
def test_auto_keep_logits_in_the_engine(tiny_qwen2, world_of_one, monkeypatch, cap, budget, gpu_bytes, kept) -> None:
    from areal_tasks.engine.fsdp import build

    monkeypatch.setattr(build, "gpu_memory_bytes", lambda device: gpu_bytes)
    config = EngineConfig(micro_batch=MicroBatchSpec(n_mbs=2, max_tokens_per_mb=cap, memory_budget_gb=budget))
    assert config.lm_head_keep_logits == "auto"
    engine = FSDPEngine(config, str(tiny_qwen2), parallel=ParallelDims(dp=1))
    engine.initialize()
    try:
        assert engine.lm_head.keep_logits is kept
        assert ("logits kept" in engine.kernels["lm_head"]) is kept
    finally:
        engine.destroy()
