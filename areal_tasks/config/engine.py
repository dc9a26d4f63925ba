"""Train-engine config: backend, optimizer, LR schedule, micro-batching, LoRA.

One ``EngineConfig`` per trained or forward-only model: ``actor`` (the policy), ``ref`` (frozen
reference for the KL term) and ``critic`` (value model). Torch-free.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.config.sections import DType

logger = logging.getLogger(__name__)


@dataclass
class OptimizerConfig:
    """The optimizer of one engine."""

    #: optimizer algorithm.
    type: Literal["adamw"] = "adamw"
    #: peak learning rate.
    lr: float = 1e-6
    #: decoupled weight decay.
    weight_decay: float = 0.01
    #: Adam beta1.
    beta1: float = 0.9
    #: Adam beta2.
    beta2: float = 0.999
    #: Adam epsilon.
    eps: float = 1e-8
    #: clip the global gradient norm to this value; 0 disables clipping.
    grad_clip: float = 1.0


@dataclass
class LRScheduleConfig:
    """Learning-rate schedule over ``train.total_steps``."""

    #: shape after warmup: ``constant``, ``linear`` decay or ``cosine`` decay.
    type: Literal["constant", "linear", "cosine"] = "constant"
    #: linear warmup steps from 0 to ``lr`` (set this or ``warmup_ratio``, not both).
    warmup_steps: int = 0
    #: warmup as a fraction of ``train.total_steps`` (set this or ``warmup_steps``, not both).
    warmup_ratio: float = 0.0
    #: decay ends at ``lr * min_lr_ratio``.
    min_lr_ratio: float = 0.0


@dataclass
class LoRAConfig:
    """Low-rank adapters instead of full fine-tuning."""

    #: train LoRA adapters only.
    enabled: bool = False
    #: adapter rank.
    rank: int = 8
    #: LoRA scaling numerator (scale = alpha / rank).
    alpha: int = 16
    #: dropout on the adapter input.
    dropout: float = 0.0
    #: module names to adapt; None = the model family's defaults.
    target_modules: list[str] | None = None


@dataclass
class ArchonConfig:
    """What only the ``archon`` backend reads: the pipeline schedule and stage split, and the MoE
    expert kernel and auxiliary loss. The layout itself (d, t, p, c, e) comes from the allocation."""

    #: pipeline schedule (with ``p`` > 1): ``1f1b``; ``interleaved_1f1b`` (several stages a rank,
    #: smaller bubble); ``gpipe`` (all forwards, then all backwards). Micro-batches are at least the
    #: number of stages (the batch is split further when it would be fewer). torch's zero-bubble
    #: schedules are not offered: under FSDP2 their separate weight-gradient pass left the loss
    #: stage without gradients (docs/engines.md).
    pp_schedule: Literal["1f1b", "interleaved_1f1b", "gpipe"] = "1f1b"
    #: pipeline stages per rank: 1 for ``1f1b``/``gpipe``, at least 2 for ``interleaved_1f1b``;
    #: ``auto`` = what the schedule needs (2 for ``interleaved_1f1b``).
    pp_stages_per_rank: int | Literal["auto"] = "auto"
    #: how layers are split into stages: balanced by ``params`` (the embedding and the LM head count
    #: on the first and last stage), by ``flops`` per token (MoE layers count their active experts),
    #: or by ``layers`` (equal counts).
    pp_balance: Literal["params", "flops", "layers"] = "params"
    #: the experts' matmuls: ``grouped_mm`` (one grouped GEMM a projection; CUDA, bf16), ``loop``
    #: (one matmul an expert; any device), ``auto`` = ``grouped_mm`` where it runs, else ``loop``.
    moe_kernel: Literal["auto", "grouped_mm", "loop"] = "auto"
    #: weight of the MoE load-balancing loss added to the training loss (HF's
    #: ``load_balancing_loss_func``); ``auto`` = the model config's ``router_aux_loss_coef`` when its
    #: ``output_router_logits`` is true, else 0 (as HF trains). Dense models ignore it.
    moe_aux_loss_coef: float | Literal["auto"] = "auto"


@dataclass
class EngineConfig:
    """One train engine (``actor``, ``ref`` or ``critic``)."""

    #: training backend; must match the allocation's training backend.
    backend: Literal["fsdp", "megatron", "archon"] = "fsdp"
    #: optimizer (ignored by forward-only engines such as ``ref``).
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    #: learning-rate schedule.
    lr_schedule: LRScheduleConfig = field(default_factory=LRScheduleConfig)
    #: how a batch is split into micro-batches.
    micro_batch: MicroBatchSpec = field(default_factory=MicroBatchSpec)
    #: LoRA adapters.
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    #: recompute activations in the backward pass to save memory.
    gradient_checkpointing: bool = False
    #: ``torch.compile`` the element-wise work (norms, MLP, LM-head chunks); ``auto`` = on CUDA only.
    compile: Literal["auto", "on", "off"] = "auto"
    #: what ``compile`` covers: ``blocks`` compiles each whole decoder block (attention call, rotary
    #: embedding, residuals, norms and MLP as one graph a block: fewer kernels and far less host
    #: work, so faster than ``pointwise`` on the 0.5B shape: docs/benchmarks_history.md, "Train
    #: throughput"); ``pointwise`` only each block's norms and MLP, the attention eager; ``auto`` =
    #: ``blocks`` where the attention runs inside a compiled graph (the engine's varlen attention on
    #: CUDA, no sequence parallelism), else ``pointwise``.
    compile_scope: Literal["auto", "blocks", "pointwise"] = "auto"
    #: with whole blocks compiled, this many consecutive blocks run as one compiled graph: each
    #: compiled call costs host time of its own (guards, the autograd function, the kernel-launching
    #: wrapper), so fewer calls leave the GPU less idle (on the 0.5B shape throughput rose with the
    #: group up to 8 blocks: docs/benchmarks_history.md, "Train throughput"). Every group shares one
    #: graph, but it takes about this many times as long to compile, which is what bounds the group.
    #: More than 1 needs the model as one FSDP unit or none (``fsdp_wrap`` resolving to ``root`` or
    #: ``none``) and one layer type. ``auto`` = the largest divisor of the number of blocks up to 8
    #: where that holds (every group the same size: one graph to compile), else 1.
    compile_blocks_per_graph: int | Literal["auto"] = "auto"
    #: the actor's chunked LM head keeps each micro-batch's logits (``tokens x vocabulary`` in the
    #: compute dtype: 5 GB for 16K tokens of Qwen2.5's 151,936-token vocabulary in bf16) from the
    #: forward, which computes them with one matmul, to the backward, which overwrites them with
    #: their gradient instead of recomputing them (one matmul of
    #: ``2 x tokens x vocabulary x hidden`` FLOPs less a micro-batch, traded for the memory of the
    #: kept logits; what it bought on the 0.5B shape: docs/benchmarks_history.md, "Train
    #: throughput"). The memory budget's micro-batch sizing counts them. ``auto`` = keep them on a
    #: GPU when micro-batches have an explicit token cap (``micro_batch.max_tokens_per_mb``) whose
    #: logits take at most 5% of its memory; without a cap (micro-batches of any length) or with one
    #: sized from ``memory_budget_gb``, recompute.
    lm_head_keep_logits: bool | Literal["auto"] = "auto"
    #: FSDP2 units: ``block`` wraps every decoder block and then the root (one all-gather per block,
    #: parameters resharded after the forward); ``root`` wraps the whole model as one unit, kept
    #: gathered from the forward to the end of the backward (one all-gather and one reduce-scatter a
    #: step, no per-block hooks; for small models, at the memory of every parameter and gradient
    #: unsharded); ``none`` (one rank, no tensor parallelism, LoRA or offload): no FSDP at all; the
    #: engine keeps flat fp32 master weights and gradients and a compute-dtype copy of the weights
    #: itself, without FSDP's per-parameter host work each step (``engine/fsdp/flat_params.py``;
    #: faster than one FSDP unit on one GPU: docs/benchmarks_history.md, "Train throughput").
    #: ``auto`` = ``none`` on one GPU where it applies, ``root`` on one rank otherwise (the CPU
    #: included), and with several ranks ``root`` on GPUs when the whole model gathered (parameters
    #: and gradients, ``N (2c + 4) / tp`` bytes) takes at most 5% of the GPU's memory (about 0.8B
    #: parameters in bf16 on an H200), else ``block`` (also with ``cpu_offload``, and on CPU).
    fsdp_wrap: Literal["auto", "block", "root", "none"] = "auto"
    #: keep parameters and optimizer state in CPU memory between uses.
    cpu_offload: bool = False
    #: compute dtype of this engine; ``auto`` = ``model.dtype``.
    dtype: DType = "auto"
    #: optimizer steps per training step (the batch is split into this many mini-batches).
    ppo_n_minibatches: int = 1
    #: add a scalar value head (critic engines).
    value_head: bool = False
    #: a vision-language model's vision tower stays as loaded (no gradients, no optimizer state);
    #: only the language model trains. Off by default: the whole model trains.
    freeze_vision: bool = False
    #: settings of the ``archon`` backend (ignored by ``fsdp``).
    archon: ArchonConfig = field(default_factory=ArchonConfig)
