"""The archon engine on one rank without FSDP (``fsdp_wrap=none``: the flat fp32 master and
compute buffers of ``engine/fsdp/flat_params.py``) trains exactly as with FSDP2 on one rank: the
same losses, gradient norms, weights after two AdamW steps and forward log-probs (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from areal_tasks.config.engine import EngineConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.archon.engine import ArchonEngine
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.errors import EngineError


def _token_mean_loss(outputs: dict, mb: dict) -> tuple[torch.Tensor, dict]:
    mask = mb["loss_mask"].float()
    return -(outputs["logprobs"] * mb["advantages"] * mask).sum() / mask.sum().clamp(min=1.0), {}


def _weight(mb: dict) -> float:
    return float(mb["loss_mask"].sum())


def _run(model_dir: str, wrap: str, batches: list[dict]) -> tuple[list[dict], dict, torch.Tensor]:
    cfg = EngineConfig(
        backend="archon",
        optimizer=OptimizerConfig(lr=1e-3, grad_clip=1.0),
        micro_batch=MicroBatchSpec(n_mbs=2),
        fsdp_wrap=wrap,  # type: ignore[arg-type]
    )
    engine = ArchonEngine(cfg, model_dir, parallel=ParallelDims(), total_steps=3)
    engine.initialize()
    assert engine.kernels["fsdp_wrap"] == ("none (flat buffers)" if wrap == "none" else "block")
    stats = [engine.train_batch(batch, _token_mean_loss, _weight) for batch in batches]
    weights = {name: t.clone() for name, t in engine.iter_weights()}
    logprobs = engine.forward_batch(batches[0])["logprobs"]
    engine.destroy()
    return stats, weights, logprobs


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2-tied"])
def test_flat_buffers_train_as_fsdp_does(family, world_of_one, tiny_model_factory, packed_batch):
    base, _, variant = family.partition("-")
    model_dir = str(tiny_model_factory(base, **({"tie_word_embeddings": True} if variant else {})))
    batches = [packed_batch(seed=seed, vocab=1000) for seed in (0, 1)]
    flat_stats, flat_weights, flat_lp = _run(model_dir, "none", batches)
    fsdp_stats, fsdp_weights, fsdp_lp = _run(model_dir, "block", batches)
    for a, b in zip(flat_stats, fsdp_stats):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    assert set(flat_weights) == set(fsdp_weights)
    for name, tensor in flat_weights.items():
        torch.testing.assert_close(tensor, fsdp_weights[name], atol=1e-6, rtol=1e-5, msg=name)
    torch.testing.assert_close(flat_lp, fsdp_lp, atol=1e-6, rtol=1e-5)


def test_flat_buffers_need_one_rank_and_no_offload(world_of_one, tiny_model_factory):
    cfg = EngineConfig(backend="archon", fsdp_wrap="none", cpu_offload=True)
    with pytest.raises(EngineError, match="fsdp_wrap=none runs the archon engine on one rank without CPU offload"):
        ArchonEngine(cfg, str(tiny_model_factory("qwen3"))).initialize()
