"""``submit_train_batch``: steps queued back to back, their stats read afterwards, train exactly as
``train_batch`` one step at a time.

Both optimizer paths are covered: the fused AdamW over the flat buffers decides on the device
(nothing is read back until ``result()``), the unfused one decides on the host. Learning-rate
changes made after a submission do not reach the submitted step, a non-finite step in the middle
of a queue is skipped and reported by its own ``result()``, and reading a result twice gives the
same values.
"""

from __future__ import annotations

import logging

import pytest
import torch

from areal_tasks.api.train_engine import CompletedStep
from areal_tasks.config.engine import EngineConfig, LRScheduleConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.fsdp.export import iter_full_tensors
from areal_tasks.engine.fsdp.optim import build_lr_scheduler, build_optimizer
from areal_tasks.engine.parallel.mesh import ParallelDims

SEEDS = (1, 2, 3)


def policy_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    mask = mb["loss_mask"].float()
    loss = -(outputs["logprobs"] * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1.0)
    return loss, {"logprob_mean": (outputs["logprobs"] * mask).sum() / mask.sum().clamp(min=1.0)}


def nan_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    loss, stats = policy_loss(outputs, mb)
    return loss * float("nan"), stats


def weight(mb: dict) -> float:
    return float(mb["loss_mask"].sum())


def engine(model_dir: str, *, fused: bool) -> FSDPEngine:
    """The flat-buffer engine of one rank, with a decaying LR (it changes every step)."""
    config = EngineConfig(
        optimizer=OptimizerConfig(lr=1e-3, grad_clip=0.5),
        micro_batch=MicroBatchSpec(n_mbs=2),
        fsdp_wrap="none",
        lr_schedule=LRScheduleConfig(type="linear", min_lr_ratio=0.1),
    )
    built = FSDPEngine(config, model_dir, parallel=ParallelDims(dp=1), total_steps=6)
    built.initialize()
    built.optimizer = build_optimizer(built.params, built.config.optimizer, fused=fused)
    built.lr_scheduler = build_lr_scheduler(built.optimizer, built.config.lr_schedule, 6)
    assert built._skips_on_device is fused
    return built


def weights(e: FSDPEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in iter_full_tensors(e.model, e.device)}


@pytest.mark.parametrize("fused", [False, True])
def test_queued_steps_train_like_one_step_at_a_time(tiny_qwen2, world_of_one, packed_batch, fused) -> None:
    torch.manual_seed(0)
    one_by_one = engine(str(tiny_qwen2), fused=fused)
    expected = []
    for seed in SEEDS:
        expected.append(one_by_one.train_batch(packed_batch(seed), policy_loss, weight))
        one_by_one.step_lr_scheduler()
    expected_weights = weights(one_by_one)
    one_by_one.destroy()

    torch.manual_seed(0)
    queued = engine(str(tiny_qwen2), fused=fused)
    submitted = []
    for seed in SEEDS:
        submitted.append(queued.submit_train_batch(packed_batch(seed), policy_loss, weight))
        queued.step_lr_scheduler()  # after the submission: the queued step keeps its own LR
    got = [step.result() for step in submitted]
    assert len({s["lr"] for s in got}) == len(SEEDS)
    assert got == expected
    for name, value in weights(queued).items():
        assert torch.equal(value, expected_weights[name]), name
    queued.destroy()


@pytest.mark.parametrize("fused", [False, True])
def test_a_non_finite_step_in_a_queue_is_skipped_and_reported_by_its_result(
    tiny_qwen2, world_of_one, packed_batch, fused, caplog
) -> None:
    e = engine(str(tiny_qwen2), fused=fused)
    first = e.submit_train_batch(packed_batch(1), policy_loss, weight)
    first.result()
    before = weights(e)
    steps_before = float(e.optimizer.state[e.params[0]]["step"])
    with caplog.at_level(logging.WARNING):
        bad = e.submit_train_batch(packed_batch(2), nan_loss, weight)
        good = e.submit_train_batch(packed_batch(3), policy_loss, weight)
        bad_stats, good_stats = bad.result(), good.result()
    assert bad_stats["update_skipped"] == 1.0 and not torch.isfinite(torch.tensor(bad_stats["grad_norm"]))
    assert good_stats["update_skipped"] == 0.0 and good_stats["grad_norm"] > 0
    assert [r.getMessage() for r in caplog.records if "optimizer step skipped" in r.getMessage()] == [
        "non-finite gradient norm nan: optimizer step skipped"
    ]
    assert float(e.optimizer.state[e.params[0]]["step"]) == steps_before + 1  # only the good step counted
    assert any(not torch.equal(value, before[name]) for name, value in weights(e).items())
    e.destroy()


def test_a_result_is_read_once_and_returned_as_a_copy(tiny_qwen2, world_of_one, packed_batch) -> None:
    e = engine(str(tiny_qwen2), fused=True)
    step = e.submit_train_batch(packed_batch(1), policy_loss, weight)
    stats = step.result()
    assert set(stats) == {"loss", "logprob_mean", "n_tokens", "lr", "grad_norm", "update_skipped"}
    stats["loss"] = 123.0
    assert step.result()["loss"] != 123.0
    assert step.result() == step.result()
    e.destroy()


def test_a_completed_step_hands_back_a_copy_of_its_stats() -> None:
    step = CompletedStep({"loss": 1.5})
    step.result()["loss"] = 0.0
    assert step.result() == {"loss": 1.5}
