"""Worker functions of the archon engine tests (run by ``launch.py`` on gloo ranks): one engine at
a layout, its loss, gradients, forward, one AdamW step and its resharding checkpoint, written per
rank for the test to compare with the single-process transformers reference."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from engine_helpers import make_batch, token_mean_loss, token_weight, value_loss

from areal_tasks.config.engine import ArchonConfig, EngineConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.archon.engine import ArchonEngine
from areal_tasks.engine.archon.model.hf_io import archon_to_hf
from areal_tasks.engine.archon.optim import grad_norm_across_stages
from areal_tasks.engine.microbatch import dp_split
from areal_tasks.engine.parallel.mesh import ParallelDims

logger = logging.getLogger(__name__)

LR = 1e-3


def build(
    model_dir: str,
    dims: dict,
    *,
    n_mbs: int = 2,
    archon: dict | None = None,
    critic: bool = False,
    options: dict | None = None,
) -> ArchonEngine:
    cfg = EngineConfig(
        backend="archon",
        optimizer=OptimizerConfig(lr=LR, grad_clip=0.0),
        micro_batch=MicroBatchSpec(n_mbs=n_mbs),
        archon=ArchonConfig(**(archon or {})),
        value_head=critic,
        **(options or {}),
    )
    engine = ArchonEngine(cfg, model_dir, parallel=ParallelDims(**dims), total_steps=4)
    engine.initialize()
    return engine


def local_share(engine: ArchonEngine, batch: dict) -> dict:
    info = engine.parallel
    return dp_split(batch, info.dp_size)[info.dp_rank] if info.dp_size > 1 else batch


def hf_grads(engine: ArchonEngine) -> dict[str, torch.Tensor]:
    """This rank's gradients (its stages'), full, under HF's on-disk names."""
    return {h: g for n, t in engine.full_gradients().items() for h, g in archon_to_hf(n, t, engine.args)}


def layout_run(
    rank: int,
    world: int,
    out_dir: Path,
    model_dir: str,
    dims: dict,
    n_mbs: int = 2,
    archon: dict | None = None,
    critic: bool = False,
    load_hf_from: str | None = None,
    options: dict | None = None,
) -> None:
    """Loss, gradients, grad norm and forward of one batch, then the weights after one AdamW step
    (``load_hf_from``: first load these HF weights into the built engine)."""
    engine = build(model_dir, dims, n_mbs=n_mbs, archon=archon, critic=critic, options=options)
    if load_hf_from:
        engine.load(load_hf_from, "hf")
    batch = make_batch(seed=0)
    loss_fn = value_loss if critic else token_mean_loss
    share = local_share(engine, batch)
    stats = engine.accumulate_gradients(share, loss_fn, token_weight)
    grads = hf_grads(engine)
    pp_group = engine.mesh.group("pp") if engine.mesh.dims.pp > 1 else None
    norm = float(grad_norm_across_stages(engine.norm_params, pp_group))
    forward = engine.forward_batch(batch, with_entropy=not critic)
    step = engine.train_batch(share, loss_fn, token_weight)
    params = {} if critic else {name: t.detach().clone() for name, t in engine.iter_weights()}
    torch.save(
        {"stats": stats, "grads": grads, "norm": norm, "forward": forward, "step": step, "params": params},
        out_dir / f"rank{rank}.pt",
    )
    engine.destroy()


def _full_state(engine: ArchonEngine) -> dict[str, torch.Tensor]:
    """Every parameter and its AdamW moments, full, by name (a collective)."""
    from torch.distributed.tensor import DTensor

    def full(t: torch.Tensor) -> torch.Tensor:
        return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()

    out = {}
    for part in engine.parts:
        for name, param in part.named_parameters():
            if name not in engine.owner_of:  # a tied head's copy: the embedding holds the same
                continue
            out[f"param/{name}"] = full(param)
            for key, value in engine.optimizer.state.get(param, {}).items():
                if isinstance(value, torch.Tensor) and value.dim() > 0:
                    out[f"{key}/{name}"] = full(value)
                else:
                    out[f"{key}/{name}"] = torch.as_tensor(float(value))
    return out


def reshard_save(rank: int, world: int, out_dir: Path, model_dir: str, dims: dict, archon: dict | None = None) -> None:
    """Two steps at one layout, the DCP checkpoint, and the full state it holds."""
    engine = build(model_dir, dims, archon=archon)
    for seed in (0, 1):
        engine.train_batch(local_share(engine, make_batch(seed=seed)), token_mean_loss, token_weight)
        engine.step_lr_scheduler()
    engine.set_version(2)
    engine.save(str(out_dir / "ckpt"), "dcp")
    torch.save(_full_state(engine), out_dir / f"saved_rank{rank}.pt")
    engine.destroy()


def reshard_load(rank: int, world: int, out_dir: Path, model_dir: str, dims: dict, archon: dict | None = None) -> None:
    """The checkpoint loaded at another layout: its full state, and one more step's loss."""
    engine = build(model_dir, dims, archon=archon)
    engine.load(str(out_dir / "ckpt"), "dcp")
    state = _full_state(engine)
    state["version"] = torch.tensor(float(engine.get_version()))
    stats = engine.train_batch(local_share(engine, make_batch(seed=2)), token_mean_loss, token_weight)
    state["next_loss"] = torch.tensor(stats["loss"])
    torch.save(state, out_dir / f"loaded_rank{rank}.pt")
    engine.destroy()


def export_run(rank: int, world: int, out_dir: Path, model_dir: str, dims: dict) -> None:
    """The HF export of a freshly built engine, and the same weights loaded back through ``load``."""
    engine = build(model_dir, dims)
    engine.save(str(out_dir / "hf"), "hf")
    engine.load(str(out_dir / "hf"), "hf")
    engine.save(str(out_dir / "hf_again"), "hf")
    engine.destroy()
