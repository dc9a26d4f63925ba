"""The FSDP2 train engine: one rank of a dp x sp x tp sharded HF causal LM (or critic), or of a
data-parallel vision-language model (Qwen2-VL, Qwen2.5-VL: ``engine/vision.py``).

Build: load the HF model in fp32 on every rank (same seed), add LoRA adapters (peft) or the value
head, enable gradient checkpointing, apply the tensor-parallel plan over ``tp``, then ``fully_shard``
every decoder block and the root over ``dp x sp`` with a mixed-precision policy (bf16 compute with
fp32 reduction on GPU by default, fp32 on CPU) and optional CPU offload. AdamW + LR schedule.

Loss normalisation (see ``api/train_engine.py``): every micro-batch's loss is scaled by
``weight / total_weight`` (``total_weight`` all-reduced over dp) and by the FSDP group size, which
cancels FSDP's mean over ``dp x sp`` -- gradients become a sum of exactly-weighted terms, the same
however the batch is split over micro-batches and ranks.

Host/device traffic: a batch is split into micro-batches on the host (the split reads lengths),
the loss weights are computed there, and the micro-batches go to the device in one batch of
non-blocking copies; per-micro-batch losses and stats stay on the device until the step's one
read-back. The per-micro-batch hot path (forward, loss, backward) never waits for the device, so
the host can queue the next micro-batch's kernels while the device runs. ``submit_train_batch``
returns with the whole step queued and its read-back still to come (``step_stats.QueuedStep``): a
loop can queue the next step before it reads this one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any

from areal_tasks.api.train_engine import (
    Batch,
    LossFn,
    LossWeightFn,
    ParallelInfo,
    SaveFormat,
    SubmittedStep,
    TrainEngine,
    TrainStats,
)
from areal_tasks.engine import module_state
from areal_tasks.engine.fsdp import checkpoint
from areal_tasks.engine.fsdp.build import BuiltModel, build_model
from areal_tasks.engine.fsdp.forward import ForwardSpec, MicroBatchForward
from areal_tasks.engine.fsdp.optim import (
    build_lr_scheduler,
    build_optimizer,
    clip_coefficient,
    clip_grad_norm,
    global_grad_norm,
)
from areal_tasks.engine.fsdp.step_stats import PendingStats, QueuedStep, WeightedSums
from areal_tasks.engine.parallel.mesh import EngineMesh, ParallelDims
from areal_tasks.engine.step_common import (
    all_reduce_sum,
    backward_micro_batch,
    init_default_group,
    local_device,
    loss_weights,
    plan_micro_batches,
)
from areal_tasks.engine.vision import VLMInputs, is_vision_language, vision_tower_trains, with_vision_tower
from areal_tasks.errors import EngineError
from areal_tasks.trace import span

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from areal_tasks.api.inference import ParamSpec
    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.microbatch import MicroBatchPlan

logger = logging.getLogger(__name__)


class FSDPEngine(TrainEngine):
    """FSDP2 engine. ``role`` is ``actor`` (log-probs) or ``critic`` (values; ``config.value_head``)."""

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
        attn_implementation: str | None = None,
        chunked_lm_head: bool = True,
        seed: int = 1,
        shared_weight_buffer: bool = False,
    ) -> None:
        """``chunked_lm_head``: score log-probs with the chunked fused LM head (``lm_head.py``) where the
        model qualifies, instead of materialising the logits of a whole micro-batch.
        ``shared_weight_buffer``: the engine will publish through shared memory, so a memory
        budget must leave room for the buffer (a copy of the published weights)."""
        if config.backend != "fsdp":
            raise EngineError(f"FSDPEngine needs backend='fsdp', got {config.backend!r}")
        if temperature <= 0:
            raise EngineError(f"temperature must be > 0, got {temperature}")
        self.config = config
        self.model_path = model_path
        self.total_steps = total_steps
        self.trainable = trainable
        self.role = "critic" if config.value_head else "actor"
        self._forward_spec = ForwardSpec(role=self.role, temperature=temperature, grad_entropy=grad_entropy)
        self._requested_dims = parallel
        self._attn_implementation = attn_implementation
        self._chunked_lm_head = chunked_lm_head
        self._shared_weight_buffer = shared_weight_buffer
        self.seed = seed
        self._version = 0
        self._weight_specs: list[ParamSpec] | None = None
        self._initialized = False

    # ------------------------------------------------------------------ setup
    def initialize(self) -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            init_default_group()
        self.device = local_device()
        dims = self._requested_dims or ParallelDims.for_world(dist.get_world_size())
        self.mesh = EngineMesh(dims, self.device.type)
        torch.manual_seed(self.seed)
        built: BuiltModel = build_model(
            self.config,
            self.model_path,
            self.mesh,
            self.device,
            role=self.role,
            trainable=self.trainable,
            attn_implementation=self._attn_implementation,
            chunked_lm_head=self._chunked_lm_head,
            seed=self.seed,
        )
        self.model, self.tensor_parallel = built.model, built.tensor_parallel
        self.lm_head = built.lm_head
        self._compiled, self._compile_reason = built.compiled, built.compile_reason
        self._compile_scope = built.compile_scope
        self._blocks_per_graph = built.blocks_per_graph
        self._fsdp_wrap = built.fsdp_wrap
        #: ``fsdp_wrap=none``: the flat master/compute buffers every step runs through, else None
        self._flat = built.flat
        _settle_keep_logits(self.config, built, self.device, trainable=self.trainable)
        self.mb_spec = _micro_batch_spec(self.config, built, dims, shared_weight_buffer=self._shared_weight_buffer)
        sp_group = self.mesh.sp_group if dims.sp > 1 else None
        #: a vision-language model's inputs (``engine/vision.py``), or None for a text model
        self.vision = VLMInputs.of_model(self.model)
        # compiled whole blocks must not see the host bounds: a tuple of ints would recompile every batch
        self.forward_mb = MicroBatchForward(
            self.model,
            self._forward_spec,
            sp_group,
            lm_head=built.lm_head,
            host_bounds=built.compile_scope != "blocks",
            vision=self.vision,
            # several ranks reduce a trained vision tower's gradients: every micro-batch must have some
            ensure_image=(
                self.vision is not None
                and self.trainable
                and self.mesh.fsdp_mesh.size() > 1
                and vision_tower_trains(self.model)
            ),
        )
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self.lr_scheduler = None
        if self.trainable:
            fused = self.device.type == "cuda" and not self.config.cpu_offload
            self.optimizer = build_optimizer(self.params, self.config.optimizer, fused=fused)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, self.config.lr_schedule, self.total_steps)
        self._initialized = True
        logger.info("FSDP engine ready: %s role=%s on %s", self.parallel, self.role, self.device)

    @property
    def kernels(self) -> dict[str, str]:
        """Which attention, LM-head, compile and FSDP-unit paths the engine runs (for logs and benchmarks)."""
        self._require_init()
        config = _hf_config_of(self.model)
        config = getattr(config, "text_config", None) or config  # a VLM: its language model's attention
        attn = getattr(config, "_attn_implementation", None) or "default"
        if self.role == "critic":
            head = "value head"
        elif self.lm_head is not None:
            from areal_tasks.kernels.lm_head import chunk_kernels_kind

            kept = ", logits kept" if self.lm_head.keep_logits else ""
            head = f"chunked fused (chunk {self.lm_head.chunk}, {chunk_kernels_kind()} kernels{kept})"
        else:
            head = "full logits"
        per_graph = f", {self._blocks_per_graph} blocks a graph" if self._blocks_per_graph > 1 else ""
        compiled = (
            f"{len(self._compiled)} modules ({self._compile_scope}{per_graph})"
            if self._compiled
            else f"off ({self._compile_reason})"
        )
        return {"attention": str(attn), "lm_head": head, "compile": compiled, "fsdp_wrap": self._fsdp_wrap}

    @property
    def blocks_per_graph(self) -> int:
        """Decoder blocks a compiled graph runs (``EngineConfig.compile_blocks_per_graph`` resolved; 1
        when blocks are not grouped or not compiled)."""
        self._require_init()
        return self._blocks_per_graph

    @property
    def parallel(self) -> ParallelInfo:
        self._require_init()
        return self.mesh.info()

    def _require_init(self) -> None:
        if not self._initialized:
            raise EngineError("call initialize() first")

    def _require_trainable(self) -> None:
        self._require_init()
        if not self.trainable:
            raise EngineError("this engine was built forward-only (trainable=False)")

    # ------------------------------------------------------------- batches
    def _plan(self, batch: Batch) -> tuple[MicroBatchPlan, list[Batch], list[tuple[int, ...]]]:
        """(the plan, split on the host; its micro-batches on the device; their host sequence bounds)."""
        return plan_micro_batches(batch, self.mb_spec, self.mesh.dp_group, self.device)

    def _all_reduce_dp(self, values: list[float]) -> list[float]:
        return all_reduce_sum(values, self.mesh.dp_group, self.device)

    def _run(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn, *, backward: bool) -> PendingStats:
        """Forward (and backward) of every micro-batch; the stats stay on the device until
        :meth:`PendingStats.read` (a step can queue its optimizer work first). With the flat
        buffers the weights' cast to the compute dtype is queued first, so the device runs it while
        the host plans the micro-batches."""
        with self._computing():
            return self._run_micro_batches(batch, loss_fn, loss_weight_fn, backward=backward)

    def _run_micro_batches(
        self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn, *, backward: bool
    ) -> PendingStats:
        import torch

        plan, device_mbs, bounds = self._plan(batch)
        weights = loss_weights(plan.micro_batches, loss_weight_fn)  # host copies: no device sync
        total_weight, n_tokens = self._all_reduce_dp([sum(weights), float(plan.n_tokens)])
        if total_weight <= 0:
            raise EngineError("the loss weights of the whole batch sum to 0 on every rank: nothing to train on")
        # FSDP averages gradients over dp x sp; each rank's term is already exactly weighted.
        grad_scale = float(self.mesh.fsdp_mesh.size())
        sums = WeightedSums()
        # one FSDP unit: gather (and cast) the parameters once a step, not once a micro-batch; the
        # last backward reshards (also after an error, so no later step keeps them gathered)
        keep_gathered = backward and self._fsdp_wrap == "root" and len(device_mbs) > 1
        try:
            for i, (mb, mb_bounds, weight) in enumerate(zip(device_mbs, bounds, weights)):
                if keep_gathered:
                    self.model.set_reshard_after_backward(i == len(device_mbs) - 1)
                with torch.set_grad_enabled(backward):
                    with span("micro-batch forward", "train", micro_batch=i, grad=backward):
                        outputs = self.forward_mb(mb, with_entropy=True, bounds=mb_bounds)
                        loss, stats = loss_fn(outputs, mb)
                    if backward:
                        with span("micro-batch backward", "train", micro_batch=i):
                            backward_micro_batch(loss, outputs, weight, total_weight, grad_scale)
                if backward and self._flat is not None:
                    self._flat.accumulate()  # into the fp32 master gradients
                if weight > 0:
                    sums.add({"loss": loss, **stats}, weight)
        finally:
            if keep_gathered:
                self.model.set_reshard_after_backward(True)
        return PendingStats(self._all_reduce_dp, sums, total_weight, n_tokens)

    def _computing(self) -> contextlib.AbstractContextManager[None]:
        """Around a step's forwards and backwards: with ``fsdp_wrap=none`` the modules hold the
        compute-dtype copy of the weights (``flat_params.py``); with FSDP nothing (its hooks do it)."""
        return self._flat.computing() if self._flat is not None else contextlib.nullcontext()

    def accumulate_gradients(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        """Forward/backward of ``batch`` into the gradients, without stepping (``train_batch`` minus the step).

        Gradients add up over calls until the next ``train_batch``/``zero_grad``; useful to inspect them.
        """
        return self._accumulate(batch, loss_fn, loss_weight_fn).read()

    def _accumulate(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> PendingStats:
        self._require_trainable()
        self.model.train()
        pending = self._run(batch, loss_fn, loss_weight_fn, backward=True)
        if self.tensor_parallel is not None:
            self.tensor_parallel.sync_partial_grads()
        return pending

    def zero_grad(self) -> None:
        self._require_trainable()
        if self._flat is not None:
            self._flat.zero_grad()  # no kernel: the next accumulation overwrites the flat buffer
        else:
            self.optimizer.zero_grad(set_to_none=True)

    def train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        """Gradients of ``batch``, clipped, and one optimizer step; a non-finite gradient norm skips
        the step (``update_skipped``): :meth:`submit_train_batch`, then its stats."""
        return self.submit_train_batch(batch, loss_fn, loss_weight_fn).result()

    def submit_train_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> SubmittedStep:
        """Queue :meth:`train_batch`'s work and return before reading anything back.

        With the flat buffers and the fused AdamW (one GPU) the update kernel clips and skips on the
        device (:meth:`_fused_step`), so the host never waits for the device: the returned step's
        ``result()`` is the step's only read-back, and a loop that submits the next batch first
        keeps the device busy while the host prepares it. Otherwise (CPU, FSDP's sharded
        gradients) the host reads the gradient norm to decide the step, and only the losses wait."""
        self.zero_grad()
        pending = self._accumulate(batch, loss_fn, loss_weight_fn)
        lr = float(self.optimizer.param_groups[0]["lr"])
        with span("optimizer step", "train"):
            if self._skips_on_device:
                norm = global_grad_norm(self.params)
                self._fused_step(norm)
                step = QueuedStep(pending, norm, lr, skip_logged=False)
            else:
                grad_norm = float(clip_grad_norm(self.params, self.config.optimizer.grad_clip))
                if math.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    logger.warning("non-finite gradient norm %s: optimizer step skipped", grad_norm)
                step = QueuedStep(pending, grad_norm, lr, skip_logged=True)
        self.zero_grad()
        return step

    def _fused_step(self, norm: torch.Tensor) -> None:
        """One fused AdamW step that clips and skips on the device: the gradients are divided by
        the inverse clipping factor inside the update kernel (its ``grad_scale``, a pass over the
        gradients fewer than scaling them first) and a non-finite ``norm`` skips the update and
        the step count (its ``found_inf``)."""
        import torch

        coef = clip_coefficient(norm, self.config.optimizer.grad_clip)
        self.optimizer.found_inf = (~torch.isfinite(norm)).to(torch.float32)
        if coef is not None:
            self.optimizer.grad_scale = coef.reciprocal().to(torch.float32)
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf
            if coef is not None:
                del self.optimizer.grad_scale

    @property
    def _skips_on_device(self) -> bool:
        """Whether the fused AdamW skips a non-finite step on the device (plain tensors on CUDA:
        the flat buffers; FSDP's DTensors do not mix with the plain ``found_inf`` flag)."""
        return self._flat is not None and bool(self.optimizer.defaults.get("fused"))

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """``{parameter name: full gradient}`` gathered from all shards (a collective; on every rank)."""
        from torch.distributed.tensor import DTensor

        self._require_init()
        out = {}
        for name, param in self.model.named_parameters():
            if param.grad is not None:
                grad = param.grad
                out[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().clone()
        return out

    def eval_batch(self, batch: Batch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> TrainStats:
        self._require_init()
        self.model.eval()
        return self._run(batch, loss_fn, loss_weight_fn, backward=False).read()

    def forward_batch(self, batch: Batch, *, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        import torch

        self._require_init()
        self.model.eval()
        plan, device_mbs, bounds = self._plan(batch)
        with torch.no_grad(), self._computing():
            outs = [self.forward_mb(mb, with_entropy=with_entropy, bounds=b) for mb, b in zip(device_mbs, bounds)]
        return {key: plan.merge([o[key] for o in outs]) for key in outs[0]}

    def step_lr_scheduler(self) -> float:
        self._require_trainable()
        self.lr_scheduler.step()
        return float(self.lr_scheduler.get_last_lr()[0])

    # ------------------------------------------------------- save / load
    def save(
        self, path: str, format: SaveFormat = "hf", *, with_optimizer: bool = True, lora_adapters_only: bool = False
    ) -> None:
        """``hf``: full weights (LoRA merged unless ``lora_adapters_only``); ``dcp``: the train state."""
        self._require_init()
        if format == "hf":
            checkpoint.save_hf(
                path, self.model, self.device, source_dir=self.model_path, lora_adapters_only=lora_adapters_only
            )
        elif format == "dcp":
            optimizer = self.optimizer if with_optimizer else None
            checkpoint.save_dcp(path, self.model, optimizer, self._train_state())
        else:
            raise EngineError(f"save format must be 'hf' or 'dcp', got {format!r}")

    def load(self, path: str, format: SaveFormat = "dcp", *, with_optimizer: bool = True) -> None:
        self._require_init()
        if format == "hf":
            checkpoint.load_hf(path, self.model)
        elif format == "dcp":
            state = checkpoint.load_dcp(path, self.model, self.optimizer if with_optimizer else None)
            self._version = int(state["version"])
            if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
                self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        else:
            raise EngineError(f"load format must be 'hf' or 'dcp', got {format!r}")

    def _train_state(self) -> dict[str, Any]:
        sched = self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None
        return {"version": self._version, "lr_scheduler": sched}

    # ------------------------------------------- checkpointable (checkpoint/)
    def sharded_state(self) -> dict[str, Any]:
        self._require_init()
        return module_state.sharded_state(self.model, self.optimizer)

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        self._require_init()
        module_state.load_sharded_state(self.model, self.optimizer, state)

    def engine_state(self) -> dict[str, Any]:
        self._require_init()
        return module_state.engine_state(
            self.model, self.optimizer, self.lr_scheduler, version=self._version, role=self.role
        )

    def load_engine_state(self, state: dict[str, Any]) -> None:
        self._require_init()
        self.set_version(module_state.load_engine_state(self.optimizer, self.lr_scheduler, state))

    def hf_sidecar_files(self) -> dict[str, bytes]:
        from areal_tasks.models.hf_dir import hf_config_of, hf_sidecar_files

        self._require_init()
        return hf_sidecar_files(hf_config_of(self.model), self.model_path)

    # -------------------------------------------------- weights / version
    # The engine is a WeightSource (api/weights.py): the transports in areal_tasks.weights publish
    # what it offers here; the state of an update (groups, buffers, packed bytes) is theirs.
    def weight_specs(self) -> list[ParamSpec]:
        from areal_tasks.engine.fsdp.weight_source import weight_specs

        self._require_init()
        if self._weight_specs is None:  # names, dtypes and shapes are fixed once the model is built
            self._weight_specs = weight_specs(self)
        return list(self._weight_specs)

    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full HF-named tensors, gathered (a collective: every rank iterates to the end)."""
        from areal_tasks.engine.fsdp.weight_source import iter_weights

        self._require_init()
        return iter_weights(self)

    def hf_config(self) -> Any:
        """The model's ``transformers`` config (what a disk update writes as ``config.json``)."""
        self._require_init()
        return _hf_config_of(self.model)

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        if version < 0:
            raise EngineError(f"version must be >= 0, got {version}")
        self._version = int(version)

    def destroy(self) -> None:
        self.model = self.optimizer = self.lr_scheduler = None
        self._weight_specs = None
        self._initialized = False


def _hf_config_of(model: torch.nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None and hasattr(model, "get_base_model"):  # peft
        config = getattr(model.get_base_model(), "config", None)
    return config


def _settle_keep_logits(config: EngineConfig, built: BuiltModel, device: torch.device, *, trainable: bool) -> None:
    """Whether the chunked LM head keeps the logits (``lm_head_keep_logits``): never without a
    backward; ``auto`` where micro-batches have an explicit token cap whose logits fit a share of
    the GPU (:func:`~areal_tasks.kernels.lm_head.auto_keep_logits`; a cap sized from the memory
    budget would shrink to make room for them, so it keeps nothing)."""
    import torch

    from areal_tasks.engine.fsdp.build import gpu_memory_bytes
    from areal_tasks.kernels.lm_head import auto_keep_logits

    head, setting = built.lm_head, config.lm_head_keep_logits
    if head is None:
        return
    if setting == "auto":
        spec = config.micro_batch
        setting = auto_keep_logits(
            token_cap=spec.max_tokens_per_mb if spec.memory_budget_gb is None else None,
            vocab_size=head.out_features,
            itemsize=getattr(torch, built.param_dtype_name).itemsize,
            device_bytes=gpu_memory_bytes(device),
        )
    head.keep_logits = setting is True and trainable


def _micro_batch_spec(
    config: EngineConfig, built: BuiltModel, dims: ParallelDims, *, shared_weight_buffer: bool = False
) -> Any:
    """The engine's micro-batch spec: padded for sp, token cap resolved from the memory budget
    (less the shared weight-update buffer when the engine keeps one, and a VLM's vision tower)."""
    from areal_tasks.models.memory import estimate_memory, resolve_max_tokens_per_mb

    spec = config.micro_batch
    multiple = math.lcm(spec.pad_to_multiple_of, dims.sp)
    cap = spec.max_tokens_per_mb
    if spec.memory_budget_gb is not None:
        estimate = estimate_memory(
            built.hf_config,
            param_dtype=built.param_dtype_name,
            dp=dims.dp,
            tp=dims.tp,
            sp=dims.sp,
            fsdp_wrap=built.fsdp_wrap,
            gradient_checkpointing=config.gradient_checkpointing,
            lora_rank=config.lora.rank if config.lora.enabled else None,
            ce_chunk_tokens=built.lm_head.chunk if built.lm_head is not None else None,
            ce_keep_logits=built.lm_head is not None and built.lm_head.keep_logits,
            publish_buffer=shared_weight_buffer,
        )
        if is_vision_language(built.hf_config):  # the estimate above is the language model's
            estimate = with_vision_tower(estimate, built.model)
        cap = resolve_max_tokens_per_mb(spec, estimate, multiple=multiple)
    return dataclasses.replace(spec, pad_to_multiple_of=multiple, max_tokens_per_mb=cap)
