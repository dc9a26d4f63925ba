"""Worker functions run by :mod:`launch` on every rank of the FSDP engine tests.

Each builds an engine over the whole world with the parallel layout it is given, runs the same
batch, and rank 0 saves what the test compares (``torch.save`` into ``out_dir``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from engine_helpers import make_batch, token_mean_loss, token_weight, value_loss

from areal_tasks.config.engine import EngineConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.fsdp.optim import global_grad_norm
from areal_tasks.engine.microbatch import dp_split
from areal_tasks.engine.parallel.mesh import ParallelDims

logger = logging.getLogger(__name__)


def engine_config(n_mbs: int = 1, *, lr: float = 1e-3, grad_clip: float = 0.0, **overrides) -> EngineConfig:
    return EngineConfig(
        optimizer=OptimizerConfig(lr=lr, weight_decay=0.01, grad_clip=grad_clip),
        micro_batch=MicroBatchSpec(n_mbs=n_mbs),
        **overrides,
    )


def build_engine(model_dir: str, cfg: EngineConfig, *, sp: int = 1, tp: int = 1, **kwargs) -> FSDPEngine:
    world = torch.distributed.get_world_size()
    engine = FSDPEngine(cfg, model_dir, parallel=ParallelDims.for_world(world, sp=sp, tp=tp), **kwargs)
    engine.initialize()
    return engine


def publish_to_disk(engine: FSDPEngine, path: Path, version: int) -> None:
    """A disk weight update of ``engine`` to ``path`` (every rank; rank 0 writes), as the trainer's does."""
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.weights.base import PublishContext
    from areal_tasks.weights.disk import DiskTransport

    DiskTransport(engine, PublishContext(path.parent)).send(WeightUpdateMeta.disk(str(path), version))


def local_share(engine: FSDPEngine, batch: dict) -> dict:
    info = engine.parallel
    return dp_split(batch, info.dp_size)[info.dp_rank] if info.dp_size > 1 else batch


def full_params(engine: FSDPEngine) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for n, p in engine.model.named_parameters()
    }


def grads_and_step(
    rank: int,
    world: int,
    out_dir: Path,
    model_dir: str,
    n_mbs_list: list[int],
    sp: int = 1,
    tp: int = 1,
    grad_clip: float = 0.5,
    critic: bool = False,
    fsdp_wrap: str = "auto",
) -> None:
    """For each micro-batch count: gradients of one batch, then one clipped AdamW step; the result
    also holds the FSDP units built and the weights a weight update would publish."""
    from areal_tasks.engine.fsdp.export import iter_full_tensors
    from areal_tasks.engine.fsdp.gather import fsdp_units

    batch = make_batch(seed=0)
    loss_fn = value_loss if critic else token_mean_loss
    for n_mbs in n_mbs_list:
        cfg = engine_config(n_mbs, grad_clip=grad_clip, value_head=critic, fsdp_wrap=fsdp_wrap)
        engine = build_engine(model_dir, cfg, sp=sp, tp=tp)
        local = local_share(engine, batch)
        stats = engine.accumulate_gradients(local, loss_fn, token_weight)
        grads = engine.full_gradients()
        step_stats = engine.train_batch(local, loss_fn, token_weight)
        params = full_params(engine)
        published = dict(iter_full_tensors(engine.model, engine.device, in_param_dtype=True))
        logprobs = None if critic else engine.forward_batch(batch, with_entropy=True)
        if rank == 0:
            torch.save(
                {
                    "stats": stats,
                    "grads": grads,
                    "step_stats": step_stats,
                    "params": params,
                    "forward": logprobs,
                    "units": sorted(fsdp_units(engine.model)),
                    "published": published,
                },
                out_dir / f"result_mbs{n_mbs}.pt",
            )
        engine.destroy()


def _train_steps(engine: FSDPEngine, batches: list[dict]) -> list[float]:
    lrs = []
    for batch in batches:
        stats = engine.train_batch(local_share(engine, batch), token_mean_loss, token_weight)
        lrs.append(stats["lr"])
        engine.step_lr_scheduler()
    return lrs


def checkpoint_roundtrip(rank: int, world: int, out_dir: Path, model_dir: str) -> None:
    """Train 2 steps, save DCP + HF + a disk weight update, train 2 more; a fresh engine loads the
    DCP checkpoint and trains the same 2 steps; another loads the HF export."""
    from areal_tasks.config.engine import LRScheduleConfig

    batches = [make_batch(seed=s) for s in range(4)]
    cfg = engine_config(2, grad_clip=1.0, lr_schedule=LRScheduleConfig(type="cosine", warmup_steps=1))
    first = build_engine(model_dir, cfg, total_steps=4)
    _train_steps(first, batches[:2])
    first.set_version(2)
    first.save(str(out_dir / "dcp"), "dcp")
    first.save(str(out_dir / "hf"), "hf")
    publish_to_disk(first, out_dir / "disk_update", version=2)
    at_save = full_params(first)
    forward = first.forward_batch(batches[0])
    lrs_first = _train_steps(first, batches[2:])
    final_first = full_params(first)
    first.destroy()

    resumed = build_engine(model_dir, cfg, total_steps=4)
    resumed.load(str(out_dir / "dcp"), "dcp")
    version = resumed.get_version()
    lrs_resumed = _train_steps(resumed, batches[2:])
    final_resumed = full_params(resumed)
    resumed.destroy()

    from_hf = build_engine(model_dir, cfg, trainable=False)
    from_hf.load(str(out_dir / "hf"), "hf")
    loaded_hf = full_params(from_hf)
    from_hf.destroy()
    if rank == 0:
        torch.save(
            {
                "at_save": at_save,
                "forward": forward,
                "final_first": final_first,
                "final_resumed": final_resumed,
                "lrs": (lrs_first, lrs_resumed),
                "version": version,
                "loaded_hf": loaded_hf,
            },
            out_dir / "result.pt",
        )


def family_grads(
    rank: int,
    world: int,
    out_dir: Path,
    model_dirs: dict[str, str],
    sp: int = 1,
    tp: int = 1,
    n_mbs: int = 2,
    options: dict | None = None,
) -> None:
    """Per family: loss, gradients and forward log-probs of one batch under the given layout
    (``options``: extra EngineConfig fields such as gradient_checkpointing)."""
    batch = make_batch(seed=0)
    for family, model_dir in model_dirs.items():
        engine = build_engine(model_dir, engine_config(n_mbs, **(options or {})), sp=sp, tp=tp)
        stats = engine.accumulate_gradients(local_share(engine, batch), token_mean_loss, token_weight)
        grads = engine.full_gradients()
        norm = float(global_grad_norm(engine.params))
        forward = engine.forward_batch(batch, with_entropy=True)
        if rank == 0:
            torch.save({"stats": stats, "grads": grads, "norm": norm, "forward": forward}, out_dir / f"{family}.pt")
        engine.destroy()


LORA = {"enabled": True, "rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "up_proj"]}


def lora_run(rank: int, world: int, out_dir: Path, model_dir: str) -> None:
    """LoRA over dp=2: one train step, then the gradients of a second batch; merged and adapter exports."""
    from areal_tasks.config.engine import LoRAConfig

    engine = build_engine(model_dir, engine_config(2, grad_clip=0.0, lora=LoRAConfig(**LORA)))
    batches = [make_batch(seed=0), make_batch(seed=1)]
    step_stats = engine.train_batch(local_share(engine, batches[0]), token_mean_loss, token_weight)
    stats = engine.accumulate_gradients(local_share(engine, batches[1]), token_mean_loss, token_weight)
    grads = engine.full_gradients()
    params = full_params(engine)
    forward = engine.forward_batch(batches[1])
    engine.save(str(out_dir / "merged"), "hf")
    engine.save(str(out_dir / "adapter"), "hf", lora_adapters_only=True)
    if rank == 0:
        torch.save(
            {"step_stats": step_stats, "stats": stats, "grads": grads, "params": params, "forward": forward},
            out_dir / "result.pt",
        )
    engine.destroy()


def critic_run(rank: int, world: int, out_dir: Path, model_dir: str) -> None:
    """A value-head critic over dp=2: gradients of one batch and its forward values."""
    engine = build_engine(model_dir, engine_config(2, value_head=True))
    batch = make_batch(seed=0)
    stats = engine.accumulate_gradients(local_share(engine, batch), value_loss, token_weight)
    grads = engine.full_gradients()
    forward = engine.forward_batch(batch)
    if rank == 0:
        torch.save({"stats": stats, "grads": grads, "forward": forward}, out_dir / "result.pt")
    engine.destroy()


def collective_run(
    rank: int, world: int, out_dir: Path, model_dir: str, port: int, group: str, bucket_bytes: int
) -> None:
    """Publish weights over a collective group twice (before and after a train step, dp=2); rank 0
    first writes the weight specs (``specs.json``) the receiver plans its buckets from."""
    import dataclasses
    import json

    from areal_tasks.api.weight_update import WeightUpdateMeta

    def meta(version: int) -> WeightUpdateMeta:
        return WeightUpdateMeta.collective(
            version, "127.0.0.1", port, 2, group_name=group, bucket_bytes=bucket_bytes, timeout_s=120
        )

    from areal_tasks.weights.base import PublishContext
    from areal_tasks.weights.collective import CollectiveTransport

    engine = build_engine(model_dir, engine_config(1))
    transport = CollectiveTransport(engine, PublishContext(out_dir))
    if rank == 0:  # written before the group exists, so the receiver reads it once it has joined
        (out_dir / "specs.json").write_text(json.dumps([dataclasses.asdict(s) for s in engine.weight_specs()]))
    transport.send(meta(1))
    first = full_params(engine)
    engine.train_batch(local_share(engine, make_batch(seed=0)), token_mean_loss, token_weight)
    transport.send(meta(2))
    second = full_params(engine)
    if rank == 0:
        torch.save({"first": first, "second": second}, out_dir / "result.pt")
    transport.close()
    engine.destroy()


def shared_run(rank: int, world: int, out_dir: Path, model_dir: str) -> None:
    """Publish weights into the shared buffer twice (dp=2): staged before a pause, then directly
    after a train step; rank 0 reads the buffer as a server would and saves both reads, the
    engine's own weights, the descriptions and whether the buffer's file is gone after the
    transport is closed."""
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.weights.base import PublishContext
    from areal_tasks.weights.buckets import split_flat
    from areal_tasks.weights.shared import SharedTransport
    from areal_tasks.weights.shared_buffer import open_shared_buffer

    engine = build_engine(model_dir, engine_config(1))
    transport = SharedTransport(engine, PublishContext(out_dir))
    layout = transport.layout

    def read() -> dict[str, torch.Tensor]:
        flat = open_shared_buffer(transport.descriptions[0])
        views = split_flat(
            flat, [s.name for s in layout], [getattr(torch, s.dtype) for s in layout], [list(s.shape) for s in layout]
        )
        return {name: view.clone() for name, view in views.items()}

    first_meta = WeightUpdateMeta.shared(1)
    transport.prepare(first_meta)
    transport.send(first_meta)  # packed by prepare: no second gather
    first = read() if rank == 0 else None
    expected_first = full_params(engine)
    engine.train_batch(local_share(engine, make_batch(seed=0)), token_mean_loss, token_weight)
    transport.send(WeightUpdateMeta.shared(2))
    second = read() if rank == 0 else None
    expected_second = full_params(engine)
    descriptions = transport.descriptions
    transport.close()
    engine.destroy()
    if rank == 0:
        gone = not Path(descriptions[0]["path"]).exists()
        torch.save(
            {
                "first": first,
                "second": second,
                "expected_first": expected_first,
                "expected_second": expected_second,
                "descriptions": descriptions,
                "gone": gone,
            },
            out_dir / "result.pt",
        )


def tp_publish(rank: int, world: int, out_dir: Path, model_dir: str) -> None:
    """tp=2: publish the weights to disk as a weight update (tensor-parallel shards are gathered
    after their FSDP unit's unshard); rank 0 saves the engine's own full parameters to compare."""
    engine = build_engine(model_dir, engine_config(1), tp=2)
    engine.train_batch(local_share(engine, make_batch(seed=0)), token_mean_loss, token_weight)
    publish_to_disk(engine, out_dir / "published", version=1)
    params = full_params(engine)
    engine.train_batch(local_share(engine, make_batch(seed=1)), token_mean_loss, token_weight)  # still trains
    if rank == 0:
        torch.save({"params": params}, out_dir / "result.pt")
    engine.destroy()
