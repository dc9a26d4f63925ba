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

from engine_helpers import make_batch, token_mean_loss, token_weight

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def train(model_dir: str, wrap: str) -> tuple[list[float], dict[str, torch.Tensor], dict[str, str]]:
    from areal_tasks.config.engine import EngineConfig, OptimizerConfig
    from areal_tasks.config.micro_batch import MicroBatchSpec
    from areal_tasks.engine.fsdp.engine import FSDPEngine
    from areal_tasks.engine.fsdp.export import iter_full_tensors
    from areal_tasks.engine.parallel.mesh import ParallelDims

    config = EngineConfig(
        optimizer=OptimizerConfig(lr=1e-3, grad_clip=1.0),
        micro_batch=MicroBatchSpec(n_mbs=2),
        fsdp_wrap=wrap,
        compile_blocks_per_graph=2,
        lm_head_keep_logits=True,
    )
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


def test_the_gradient_kernel_adds_up_like_the_torch_ops() -> None:
    """``flat_grad_kernels``: two micro-batches' bf16 gradients (one parameter unused, sizes off the
    kernel's block) land in the fp32 master gradients exactly as the concatenation and add do."""
    import copy

    from areal_tasks.engine.fsdp import flat_grad_kernels
    from areal_tasks.engine.fsdp.flat_params import FlatParams

    if not flat_grad_kernels.kernels_available():
        pytest.skip("needs Triton")
    torch.manual_seed(0)
    width = flat_grad_kernels.BLOCK + 3
    model = torch.nn.Sequential(torch.nn.Linear(37, width), torch.nn.Linear(width, 5), torch.nn.Linear(5, 5)).cuda()
    reference_model = copy.deepcopy(model)
    flat, reference = FlatParams(model, torch.bfloat16), FlatParams(reference_model, torch.bfloat16)
    assert flat.grad_table is not None
    reference.grad_table = None  # the torch-op path
    inputs = [torch.randn(4, 37, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    for params, net in ((flat, model), (reference, reference_model)):
        with params.computing():
            for x in inputs:  # the third layer stays unused: its gradient is None
                net[1](net[0](x)).float().square().sum().backward()
                params.accumulate()
    assert flat.compute_grad is None  # the kernel path never needed the concatenation buffer
    torch.testing.assert_close(flat.master_grad, reference.master_grad, atol=0, rtol=0)
    assert flat.master_grad.abs().sum() > 0
    assert not model[2].weight.grad.any()
