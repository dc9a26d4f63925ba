"""The archon train engine: one rank of a plain-PyTorch decoder run with pipeline (``p``), expert
(``e``), tensor (``t``) and context (``c``) parallelism composed with FSDP2 over the data-parallel
ranks (``d``), as the allocation ``archon:dDtTpPcCeE`` lays them out.

Build: read the HF config and check the layout against it (``layout.py``) before anything is
allocated; build the whole decoder from the HF checkpoint on every rank; keep this rank's pipeline
stages (a stage keeps the global names of the layers it owns); split the experts over ``ep``, apply
the tensor-parallel plan and the context-parallel group, then ``fully_shard`` (``parallel/apply.py``);
AdamW with one parameter group per kind of sharding; the LR schedule of the FSDP engine.

A step follows the loss contract of ``api/train_engine.py`` exactly as the FSDP engine does: the
batch is split into micro-batches on the host (at least one a pipeline stage), every micro-batch's
loss is scaled by ``weight / total_weight`` (``total_weight`` summed over the data-parallel ranks)
and by the FSDP group size, which cancels FSDP's mean. Without pipeline stages the micro-batches run
one after the other (``forward.py``); with them, a torch pipelining schedule runs them
(``pipeline/``), the loss is computed on the last stage and its stats are sent to every stage. The
global gradient norm sums every stage's share. A MoE model adds the load-balancing loss, weighted by
``archon.moe_aux_loss_coef``, to every micro-batch's loss.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

from areal_tasks.api.train_engine import (
    Batch,
    CompletedStep,
    LossFn,
    LossWeightFn,
    ParallelInfo,
    SaveFormat,
    SubmittedStep,
    TrainEngine,
    TrainStats,
)
from areal_tasks.engine.archon.forward import AUX_LOSS_KEY, ArchonForward, HeadSpec
from areal_tasks.engine.archon.parallel.mesh import ArchonMesh
from areal_tasks.engine.fsdp.step_stats import PendingStats, WeightedSums
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.engine.step_common import (
    all_reduce_sum,
    backward_micro_batch,
    init_default_group,
    local_device,
    loss_weights,
    plan_micro_batches,
)
from areal_tasks.errors import EngineError
from areal_tasks.trace import span

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.config.engine import EngineConfig

logger = logging.getLogger(__name__)

__all__ = ["ArchonEngine"]


class ArchonEngine(TrainEngine):
    """The archon engine of one rank; ``config.value_head`` makes it a critic."""

    def __init__(
        self,
        config: EngineConfig,
        model_path: str,
        *,
        parallel: ParallelDims | None = None,
        total_steps: int = 1,
        trainable: bool = True,
        temperature: float = 1.0,
        grad_entropy: bool = False,
        seed: int = 1,
        **options: object,
    ) -> None:
        """``options`` the FSDP engine takes (``shared_weight_buffer``...) are accepted and ignored."""
        if config.backend != "archon":
            raise EngineError(f"ArchonEngine needs backend='archon', got {config.backend!r}")
        if temperature <= 0:
            raise EngineError(f"temperature must be > 0, got {temperature}")
        if config.lora.enabled:
            raise EngineError("the archon engine does not train LoRA adapters; use backend=fsdp for LoRA")
        self.config = config
        self.model_path = model_path
        self.total_steps = total_steps
        self.trainable = trainable
        self.role = "critic" if config.value_head else "actor"
        self.temperature = temperature
        self.grad_entropy = grad_entropy
        self.seed = seed
        self._requested_dims = parallel
        self._version = 0
        self._initialized = False
        self._weight_specs: list[ParamSpec] | None = None

    # ------------------------------------------------------------------ setup
    def initialize(self) -> None:
        import torch
        import torch.distributed as dist

        from areal_tasks.engine.archon.build_parts import build_parts

        if not dist.is_initialized():
            init_default_group()
        self.device = local_device()
        dims = self._requested_dims or ParallelDims.for_world(dist.get_world_size())
        self.mesh = ArchonMesh(dims, self.device.type)
        torch.manual_seed(self.seed)
        built = build_parts(self.config, self.model_path, self.mesh, self.device, role=self.role)
        self.args, self.hf_config_obj = built.args, built.hf_config
        self.parts, self.partial_grad_modules = built.parts, built.partial_grad_modules
        self.weight_order, self.owner_of = built.weight_order, built.owner_of
        self.aux_coef = built.aux_coef
        #: which compile, expert-kernel and recompute paths the engine runs (logs and benchmarks)
        self.kernels = built.kernels
        #: one rank without FSDP: the flat master/compute buffers every step runs through, else None
        self._flat = built.flat
        self.spec = HeadSpec(
            role=self.role,
            temperature=self.temperature,
            grad_entropy=self.grad_entropy,
            n_experts=built.n_experts,
            n_moe_layers=built.n_moe_layers,
        )
        self.pipeline = self.forward_mb = None
        if dims.pp > 1:
            from areal_tasks.engine.archon.pipeline_step import build_pipeline

            self.pipeline = build_pipeline(self, built)
        else:
            cp_group = self.mesh.group("cp") if dims.sp > 1 else None
            self.forward_mb = ArchonForward(self.parts[0], self.spec, cp_group)
        self.mb_spec = _micro_batch_spec(self.config, dims)
        self.params = [p for part in self.parts for p in part.parameters() if p.requires_grad]
        self.tied = None
        if dims.pp > 1 and self.args.tie_word_embeddings:
            from areal_tasks.engine.archon.tied import TiedEmbeddings

            self.tied = TiedEmbeddings(self.mesh, self.parts)
        duplicates = self.tied.head_copies(self.parts) if self.tied is not None else set()
        #: the parameters the gradient norm counts (a tied head's copy is the embedding's twin)
        self.norm_params = [p for p in self.params if p not in duplicates]
        self.optimizer = self.lr_scheduler = None
        if self.trainable:
            from areal_tasks.engine.archon.optim import build_archon_optimizer
            from areal_tasks.engine.fsdp.optim import build_lr_scheduler

            self.optimizer = build_archon_optimizer(self.params, self.config.optimizer, device=self.device)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, self.config.lr_schedule, self.total_steps)
        self._initialized = True
        logger.info("archon engine ready: %s role=%s on %s", self.parallel, self.role, self.device)

    @property
    def parallel(self) -> ParallelInfo:
        self._require_init()
        return self.mesh.info()

    @property
    def model(self) -> torch.nn.Module:
        """This rank's first stage module (the whole decoder without pipeline parallelism)."""
        self._require_init()
        return self.parts[0]

    def _require_init(self) -> None:
        if not self._initialized:
            raise EngineError("call initialize() first")

    def _require_trainable(self) -> None:
        self._require_init()
        if not self.trainable:
            raise EngineError("this engine was built forward-only (trainable=False)")

    # ------------------------------------------------------------- batches
    def _plan(self, batch: Batch) -> tuple[Any, list[Batch], list[tuple[int, ...]]]:
        """(the plan, split on the host; its micro-batches on the device; their host sequence bounds).
        Every pipeline rank of a data-parallel replica holds the same batch: agreeing over dp suffices."""
        return plan_micro_batches(batch, self.mb_spec, self.mesh.group("dp"), self.device)

    def _all_reduce_dp(self, values: list[float]) -> list[float]:
        return all_reduce_sum(values, self.mesh.group("dp"), self.device)

    def _loss_with_aux(self, loss_fn: LossFn) -> LossFn:
        """``loss_fn`` plus the weighted MoE load-balancing loss (reported as ``moe_aux_loss``)."""
        if not self.spec.n_experts:
            return loss_fn

        def with_aux(outputs: dict[str, torch.Tensor], mb: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
            aux = outputs.pop(AUX_LOSS_KEY)
            loss, stats = loss_fn(outputs, mb)
            stats = {**stats, AUX_LOSS_KEY: aux.detach()}
            return (loss + self.aux_coef * aux if self.aux_coef else loss), stats

        return with_aux

    def _run(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn, *, backward: bool) -> PendingStats:
        import torch

        plan, device_mbs, bounds = self._plan(batch)
        weights = loss_weights(plan.micro_batches, loss_weight_fn)
        total_weight, n_tokens = self._all_reduce_dp([sum(weights), float(plan.n_tokens)])
        if total_weight <= 0:
            raise EngineError("the loss weights of the whole batch sum to 0 on every rank: nothing to train on")
        grad_scale = float(self.mesh.fsdp_mesh.size())
        full_loss = self._loss_with_aux(loss_fn)
        if self.pipeline is not None:
            with span("pipeline schedule", "train", n_micro_batches=len(device_mbs), grad=backward):
                sums = self.pipeline.run(
                    device_mbs, bounds, full_loss, weights, total_weight, grad_scale=grad_scale, backward=backward
                )
            return PendingStats(self._all_reduce_dp, sums, total_weight, n_tokens)
        sums = WeightedSums()
        with self._computing():
            for i, (mb, mb_bounds, weight) in enumerate(zip(device_mbs, bounds, weights)):
                with torch.set_grad_enabled(backward):
                    with span("micro-batch forward", "train", micro_batch=i, grad=backward):
                        outputs = self.forward_mb(mb, with_entropy=True, bounds=mb_bounds)
                        loss, stats = full_loss(outputs, mb)
                    if backward:
                        with span("micro-batch backward", "train", micro_batch=i):
                            backward_micro_batch(loss, outputs, weight, total_weight, grad_scale)
                if backward and self._flat is not None:
                    self._flat.accumulate()  # into the fp32 master gradients
                if weight > 0:
                    sums.add({"loss": loss, **stats}, weight)
        return PendingStats(self._all_reduce_dp, sums, total_weight, n_tokens)

    def _computing(self) -> contextlib.AbstractContextManager[None]:
        """Around a step's forwards and backwards: with the flat buffers the modules hold the
        compute-dtype copy of the weights; with FSDP nothing (its hooks do it)."""
        return self._flat.computing() if self._flat is not None else contextlib.nullcontext()

    def _train_mode(self, on: bool) -> None:
        for part in self.parts:
            part.train(on)

    def _accumulate(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> PendingStats:
        from areal_tasks.engine.archon.parallel.apply import sync_partial_grads

        self._require_trainable()
        self._train_mode(True)
        pending = self._run(batch, loss_fn, loss_weight_fn, backward=True)
        if self.mesh.dims.ep > 1:
            _unscale_expert_grads(self.parts, self.mesh.dims.ep)
        if self.tied is not None:
            self.tied.sync_grads()
        if self.partial_grad_modules:
            sync_partial_grads(self.partial_grad_modules, self.mesh.mesh["tp"])
        return pending

    def accumulate_gradients(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        """Forward/backward of ``batch`` into the gradients, without stepping."""
        return self._accumulate(batch, loss_fn, loss_weight_fn).read()

    def zero_grad(self) -> None:
        self._require_trainable()
        if self._flat is not None:
            self._flat.zero_grad()
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        return self.submit_train_batch(batch, loss_fn, loss_weight_fn).result()

    def submit_train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> SubmittedStep:
        """Gradients of ``batch``, the global norm over every stage, clipped, one AdamW step (a
        non-finite norm skips it: ``update_skipped``)."""
        from areal_tasks.engine.archon.optim import clip_grad_norm_across_stages

        self.zero_grad()
        pending = self._accumulate(batch, loss_fn, loss_weight_fn)
        lr = float(self.optimizer.param_groups[0]["lr"])
        pp_group = self.mesh.group("pp") if self.mesh.dims.pp > 1 else None
        with span("optimizer step", "train"):
            grad_norm = float(
                clip_grad_norm_across_stages(
                    self.norm_params, self.config.optimizer.grad_clip, pp_group, also=self.params
                )
            )
            stepped = math.isfinite(grad_norm)
            if stepped:
                self.optimizer.step()
            else:
                logger.warning("non-finite gradient norm %s: optimizer step skipped", grad_norm)
        self.zero_grad()
        stats = pending.read()
        stats.update(lr=lr, grad_norm=grad_norm, update_skipped=0.0 if stepped else 1.0)
        return CompletedStep(stats)

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """``{archon name: full gradient}`` of this rank's stages, gathered from every shard (a tied LM
        head's copy is reported as the embedding it shares, by the first stage)."""
        from torch.distributed.tensor import DTensor

        self._require_init()
        out = {}
        for part in self.parts:
            for name, param in part.named_parameters():
                if param.grad is not None and name in self.owner_of:
                    grad = param.grad
                    out[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().clone()
        return out

    def eval_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        self._require_init()
        self._train_mode(False)
        return self._run(batch, loss_fn, loss_weight_fn, backward=False).read()

    def forward_batch(self, batch: Batch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        import torch

        self._require_init()
        self._train_mode(False)
        plan, device_mbs, bounds = self._plan(batch)
        with torch.no_grad(), self._computing():
            if self.pipeline is not None:
                outs = self.pipeline.forward(device_mbs, bounds, with_entropy=with_entropy)
            else:
                outs = [self.forward_mb(mb, with_entropy=with_entropy, bounds=b) for mb, b in zip(device_mbs, bounds)]
        keys = [k for k in outs[0] if k != AUX_LOSS_KEY]
        return {key: plan.merge([o[key] for o in outs]) for key in keys}

    def step_lr_scheduler(self) -> float:
        self._require_trainable()
        self.lr_scheduler.step()
        return float(self.lr_scheduler.get_last_lr()[0])

    # ------------------------------------------------------- save / load
    def save(self, path: str, format: SaveFormat = "hf", *, with_optimizer: bool = True) -> None:
        """``hf``: full weights in HF names (rank 0 writes); ``dcp``: the resharding train state."""
        from areal_tasks.engine.archon import weights

        self._require_init()
        if format == "hf":
            weights.save_hf(self, path)
        elif format == "dcp":
            weights.save_dcp(self, path, with_optimizer=with_optimizer)
        else:
            raise EngineError(f"save format must be 'hf' or 'dcp', got {format!r}")

    def load(self, path: str, format: SaveFormat = "dcp", *, with_optimizer: bool = True) -> None:
        from areal_tasks.engine.archon import weights

        self._require_init()
        if format == "hf":
            weights.load_hf(self, path)
        elif format == "dcp":
            weights.load_dcp(self, path, with_optimizer=with_optimizer)
        else:
            raise EngineError(f"load format must be 'hf' or 'dcp', got {format!r}")

    # ------------------------------------------- checkpointable (checkpoint/)
    def sharded_state(self) -> dict[str, Any]:
        from areal_tasks.engine.archon.state import sharded_state

        self._require_init()
        return sharded_state(self.parts, self.optimizer, tied=self.args.tie_word_embeddings)

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        from areal_tasks.engine.archon.state import load_sharded

        self._require_init()
        load_sharded(self.parts, self.optimizer, state, tied=self.args.tie_word_embeddings)

    def engine_state(self) -> dict[str, Any]:
        self._require_init()
        return {
            "version": self._version,
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "role": self.role,
            "lora": False,
            "lora_scalings": {},
            "tied_embeddings": bool(getattr(self.hf_config_obj, "tie_word_embeddings", False)),
            "model_type": self.args.model_type,
            "has_optimizer": self.optimizer is not None,
            "optimizer_started": self.optimizer is not None and bool(self.optimizer.state),
            "backend": "archon",
        }

    def load_engine_state(self, state: dict[str, Any]) -> None:
        from areal_tasks.engine.module_state import load_engine_state

        self._require_init()
        self.set_version(load_engine_state(self.optimizer, self.lr_scheduler, state))

    def hf_sidecar_files(self) -> dict[str, bytes]:
        from areal_tasks.models.hf_dir import hf_sidecar_files

        self._require_init()
        return hf_sidecar_files(self.hf_config_obj, self.model_path)

    # -------------------------------------------------- weights / version
    def weight_specs(self) -> list[ParamSpec]:
        from areal_tasks.engine.archon import weights

        self._require_init()
        if self._weight_specs is None:
            self._weight_specs = weights.weight_specs(self)
        return list(self._weight_specs)

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full HF-named tensors (a collective: every rank iterates to the end)."""
        from areal_tasks.engine.archon import weights

        self._require_init()
        if self.role != "actor":
            raise EngineError(f"only an actor publishes weights to inference servers, this engine is a {self.role}")
        return weights.iter_hf_weights(self)

    def hf_config(self) -> Any:
        """The model's ``transformers`` config (what a disk update writes as ``config.json``)."""
        self._require_init()
        return self.hf_config_obj

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        if version < 0:
            raise EngineError(f"version must be >= 0, got {version}")
        self._version = int(version)

    def destroy(self) -> None:
        self.parts = []
        self.optimizer = self.lr_scheduler = self.pipeline = None
        self._weight_specs = None
        self.forward_mb = None
        self._initialized = False


def _unscale_expert_grads(parts: list[torch.nn.Module], ep: int) -> None:
    """Divide the experts' gradients by ``ep``. Every loss is scaled by the FSDP group size
    (``dp x cp``) to cancel FSDP's mean; an expert's gradient already sums the tokens of its whole
    ep group (the all-to-all's backward brings them), and FSDP averages it over ``edp`` only, so it
    comes out ``dp x cp / edp = ep`` times too large."""
    import torch
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for part in parts:
            for layer in part.layers.values():
                experts = getattr(layer.mlp, "experts", None)
                for param in () if experts is None else experts.parameters():
                    if param.grad is not None:
                        grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                        grad.div_(ep)


def _micro_batch_spec(config: EngineConfig, dims: ParallelDims) -> Any:
    """The engine's micro-batch spec: padded to a multiple of tp x cp (Ulysses and sequence shapes),
    and at least one micro-batch a pipeline stage."""
    import dataclasses

    from areal_tasks.engine.archon.layout import stages_per_rank

    spec = config.micro_batch
    multiple = math.lcm(spec.pad_to_multiple_of, dims.sp)
    n_stages = dims.pp * (
        stages_per_rank(config.archon.pp_schedule, config.archon.pp_stages_per_rank) if dims.pp > 1 else 1
    )
    return dataclasses.replace(spec, pad_to_multiple_of=multiple, n_mbs=max(spec.n_mbs, n_stages if dims.pp > 1 else 1))
