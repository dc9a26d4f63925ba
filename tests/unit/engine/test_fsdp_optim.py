"""LR schedules (warmup, constant/linear/cosine, floor) and gradient-norm clipping on plain tensors."""

from __future__ import annotations

import math

import pytest
import torch

from areal_tasks.config.engine import LRScheduleConfig, OptimizerConfig
from areal_tasks.engine.fsdp.optim import build_lr_scheduler, build_optimizer, clip_grad_norm, lr_multiplier
from areal_tasks.errors import EngineError


def test_warmup_then_constant():
    cfg = LRScheduleConfig(type="constant", warmup_steps=3)
    assert [lr_multiplier(s, cfg, 10) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_warmup_ratio_is_used_when_steps_are_zero():
    cfg = LRScheduleConfig(type="constant", warmup_ratio=0.2)
    assert lr_multiplier(0, cfg, 10) == pytest.approx(1 / 3)
    assert lr_multiplier(2, cfg, 10) == 1.0


def test_linear_decays_to_the_floor():
    cfg = LRScheduleConfig(type="linear", warmup_steps=0, min_lr_ratio=0.1)
    assert lr_multiplier(0, cfg, 10) == 1.0
    assert lr_multiplier(5, cfg, 10) == pytest.approx(0.55)
    assert lr_multiplier(10, cfg, 10) == pytest.approx(0.1)
    assert lr_multiplier(50, cfg, 10) == pytest.approx(0.1)


def test_cosine_shape():
    cfg = LRScheduleConfig(type="cosine", warmup_steps=2, min_lr_ratio=0.0)
    assert lr_multiplier(2, cfg, 12) == pytest.approx(1.0)
    assert lr_multiplier(7, cfg, 12) == pytest.approx(0.5)
    assert lr_multiplier(12, cfg, 12) == pytest.approx(0.0, abs=1e-12)
    mid = lr_multiplier(4, cfg, 12)
    assert mid == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))


def test_scheduler_drives_the_optimizer_lr():
    param = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([param], OptimizerConfig(lr=0.1))
    sched = build_lr_scheduler(opt, LRScheduleConfig(type="linear", warmup_steps=1), total_steps=3)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(3):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.05, 0.1, 0.05, 0.0])


def test_bad_schedule_is_rejected_at_build_time():
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(1))], OptimizerConfig())
    with pytest.raises(EngineError, match="min_lr_ratio"):
        build_lr_scheduler(opt, LRScheduleConfig(min_lr_ratio=2.0), total_steps=3)


def test_optimizer_needs_trainable_parameters():
    frozen = torch.nn.Parameter(torch.zeros(1), requires_grad=False)
    with pytest.raises(EngineError, match="no trainable"):
        build_optimizer([frozen], OptimizerConfig())


def test_clip_matches_torch_and_returns_the_unclipped_norm():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(3)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, t in zip(params, twins):
        g = torch.randn_like(p)
        p.grad, t.grad = g.clone(), g.clone()
    expected = torch.nn.utils.clip_grad_norm_(twins, 0.5)
    norm = clip_grad_norm(params, 0.5)
    assert float(norm) == pytest.approx(float(expected), rel=1e-6)
    for p, t in zip(params, twins):
        torch.testing.assert_close(p.grad, t.grad, rtol=1e-5, atol=1e-6)


def test_clip_zero_only_measures():
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([3.0, 4.0])
    assert float(clip_grad_norm([p], 0.0)) == pytest.approx(5.0)
    assert p.grad.tolist() == [3.0, 4.0]


def test_clip_of_dtensor_gradients_reads_each_mesh_once(tmp_path, monkeypatch):
    """DTensor gradients on a one-rank mesh: clipping matches the plain-tensor norm, and the mesh's
    description is built once per mesh, not once per parameter (``DeviceMesh.mesh`` rebuilds a tensor
    on every access; per parameter it was most of the host time of clipping a 290-parameter model)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        grads = [torch.randn(8, 4) for _ in range(20)]
        params = []
        for g in grads:
            p = torch.nn.Parameter(distribute_tensor(torch.zeros(8, 4), mesh, [Shard(0)]))
            p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
            params.append(p)
        reads = []
        original = DeviceMesh.mesh
        monkeypatch.setattr(DeviceMesh, "mesh", property(lambda self: reads.append(1) or original.fget(self)))
        norm = clip_grad_norm(params, max_norm=1.0)
        want = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        assert float(norm) == pytest.approx(float(want), rel=1e-5)
        assert len(reads) <= 1
        clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.to_local()) for p in params]))
        assert float(clipped) == pytest.approx(1.0, rel=1e-4)
    finally:
        if started:
            dist.destroy_process_group()
