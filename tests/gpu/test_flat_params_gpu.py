"""``fsdp_wrap="none"`` on a CUDA GPU (skipped without one): the engine's own flat fp32 masters and
bf16 compute copy, with the decoder blocks compiled (four a graph) and the LM head's logits kept,
train like one FSDP unit: the same losses over three steps from the same start (bf16 tolerance),
falling, and the same published bf16 weights to bf16 rounding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))

from engine_helpers import make_batch, token_mean_loss, token_weight  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def train(model_dir: str, wrap: str) -> tuple[list[float], dict[str, torch.Tensor], dict[str, str]]:
    from areal_tasks.config.engine import EngineConfig, OptimizerConfig
    from areal_tasks.config.micro_batch import MicroBatchSpec
    from areal_tasks.engine.fsdp.engine import FSDPEngine
    from areal_tasks.engine.fsdp.export import iter_full_tensors
    from areal_tasks.engine.fsdp.parallel_dims import ParallelDims

    config = EngineConfig(optimizer=OptimizerConfig(lr=1e-3, grad_clip=1.0), micro_batch=MicroBatchSpec(n_mbs=2),
                          fsdp_wrap=wrap, compile_blocks_per_graph=2, lm_head_keep_logits=True)
    engine = FSDPEngine(config, model_dir, parallel=ParallelDims(dp=1), total_steps=3)
    engine.initialize()
    batch = make_batch(seed=0)
    losses = [engine.train_batch(batch, token_mean_loss, token_weight)["loss"] for _ in range(3)]
    published = {k: v.to(torch.bfloat16).cpu() for k, v in iter_full_tensors(engine.model, engine.device)}
    kernels = engine.kernels
    engine.destroy()
    return losses, published, kernels


def test_no_fsdp_trains_like_one_fsdp_unit_on_a_gpu(tiny_qwen2) -> None:
    root_losses, root_weights, _ = train(str(tiny_qwen2), "root")
    losses, weights, kernels = train(str(tiny_qwen2), "none")
    assert kernels["fsdp_wrap"] == "none" and "logits kept" in kernels["lm_head"], kernels
    assert losses == pytest.approx(root_losses, rel=2e-2, abs=2e-2)
    assert losses[-1] < losses[0], losses
    for name, value in weights.items():
        torch.testing.assert_close(value.float(), root_weights[name].float(), atol=2e-2, rtol=2e-2, msg=name)
