"""Memory estimates: one train-engine GPU, the micro-batch token cap that fits a budget, and the
per-GPU figures the layout recommendation plans with.

The one estimator. The FSDP engine sizes its micro-batches with :func:`estimate_memory` and
:func:`resolve_max_tokens_per_mb`; :func:`~areal_tasks.models.layout.recommend_layout` plans with
:func:`fsdp_train_bytes` (the same estimate) and :func:`inference_weight_bytes`, and for the
archon engine with :mod:`areal_tasks.models.memory_archon` (built on :func:`layer_activation_bytes`).
The model's sizes come from one :class:`~areal_tasks.models.dims.ModelDims`. Torch-free at import
(torch is imported only to read the device). Everything is bytes per GPU.

Notation. From the model config: ``h`` hidden size, ``L`` layers, ``a`` attention heads, ``g``
key/value heads, ``d`` head dim, ``I`` MLP intermediate size, ``V`` vocabulary; for MoE ``E``
experts, ``k`` experts per token, ``I_e`` expert and ``I_s`` shared-expert intermediate sizes.
Byte widths: ``p`` parameters, ``gr`` gradients, ``c`` compute/activations. Parallel degrees:
``tp``, ``sp`` (Ulysses), ``dp``; FSDP shards over ``S = dp * sp`` ranks (``S = 1`` unsharded).

Parameters (``N``) are counted exactly, per layer and for the root (embedding, lm_head unless tied,
final norm), by :class:`ModelDims`. LoRA of rank ``r`` on every linear ``(in, out)`` adds
``r (in + out)`` trainable parameters (``N_t``); without LoRA ``N_t = N``.

Static bytes::

    params     N   / (tp S) * p
    grads      N_t / (tp S) * gr
    optimizer  N_t / (tp S) * (8 + 4 [fp32 master, only when p < 4])   "adamw": fp32 moments
               N_t / (tp S) * 2 p                                      "adamw_pure": torch AdamW
                                                                       on params of dtype p
               0                                                       "none" (frozen / ref model)
    publish    N * c   only with shared weight updates (``rollout.weight_update=shared``): the
               buffer the servers copy the weights from, every published tensor in c, kept for
               the run

Activations, bytes per token of the micro-batch (the tokens one DP rank packs) per GPU, all divided
by ``tp * sp`` (TP splits heads and MLP columns with sequence-parallel norms; Ulysses splits
tokens)::

    norm   n = h (4 + c)          HF RMSNorm keeps an fp32 copy of its input and its output in c
    attn   c h + c d (a + 2 g) + 2 c a d + 4 a
           (q/k/v input; q, k after rotary and v; kernel output and the o_proj input copy;
           fp32 log-sum-exp. Flash-style kernels: nothing quadratic in the sequence length.
           Qwen3-style per-head q/k norms add d (a + g) (4 + c).)
    mlp    c h + 4 c I            (input; gate, SiLU(gate), up and their product)
           MoE: c h + 8 E + 2 c k h + 4 c (k I_e + I_s)
    layer  2 n + attn + mlp
    head   n + c h                final norm and lm_head input
    CE     4 V kept               fp32 log-softmax output              (unchunked cross-entropy)
           8 V transient          in backward, the fp32 gradients of its output and input; in
                                  forward, the logits in c and their fp32 copy (c + 4 <= 8)

    no checkpointing:   L * layer + head + CE kept + CE transient
    checkpointing:      L * c h + head + max(CE kept + CE transient, layer)
                        (each layer keeps only its input; one layer is recomputed in backward,
                        after the logits are freed)

The CE term assumes the engine computes log-probabilities (``log_softmax(logits.float())`` then a
gather) and drops the logits before backward; an entropy with gradient adds about ``8 V`` more. A
chunked/fused cross-entropy (``ce_chunk_tokens = C``) keeps nothing per token (``c V`` when it
keeps the logits for the backward, ``ce_keep_logits``); its ``12 C V`` bytes go to the fixed
overhead instead. With a vocabulary of 150K tokens the unchunked CE term is the largest share of
the activations of a small model, with checkpointing by far.

``tests/gpu/test_memory_estimate_gpu.py`` compares the estimate with the measured peak of one-GPU
training steps (figures in docs/benchmarks.md); the FSDP/TP/SP terms are not yet checked on GPUs.

Fixed overhead: unsharded (``S = 1``) with a compute dtype narrower than the parameters, the
compute-dtype copy of all parameters, ``N / tp * c`` (the engine wraps only the root then; without
FSDP, ``fsdp_wrap="none"``, also its compute-dtype gradients, ``N_t / tp * c``: a flat buffer on the
torch-op path, autograd's per-parameter gradients until the one-kernel accumulation adds them up
on CUDA). With FSDP (``S > 1``) the all-gathered root (embedding, lm_head, final norm) and
two layers (current + prefetch) in ``c``, and one layer's unsharded gradient in ``c`` plus its fp32
copy for the reduce-scatter; plus the chunked-CE buffer. With FSDP and the whole model as one unit
(``fsdp_wrap="root"``): every parameter gathered, ``N / tp * c``, and at the end of backward every
gradient unsharded with its fp32 reduce copy, ``N_t (c + 4) / tp``, as a late transient. Late
transients come after the activations are freed: the optimizer step (foreach AdamW) needs one
temporary the size of one moment, ``N_t / (tp S) * 4`` (``p`` for adamw_pure), and FSDP reduces the
root's unsharded gradient (``root * (c + 4) / tp``) at the end of backward. The peak for ``T``
tokens is::

    static + max(fixed + T * per_token, late transients)

Layout planning (rules of thumb for a first allocation, not a guarantee). FSDP training: the
estimate above with activation checkpointing on, and the chunked cross-entropy of the engine's LM
head where the family allows it (else the full-vocabulary term); a vision tower's parameters are
sharded like the rest. Archon (MoE, expert and pipeline parallelism): ``memory_archon.py``.
Inference: bf16 weights (2 bytes a parameter) divided by TP, which must leave a share of the GPU
for the KV cache.

Not modelled here: expert parallelism and pipeline stages (``memory_archon.py`` has them), the
activations of latent attention (estimated as multi-head attention of head dim ``d``),
vision-tower activations, the ``T x T`` mask of SDPA fallbacks, allocator fragmentation (hence the 0.9 fraction of
:func:`device_memory_budget` and :data:`USABLE_FRACTION`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError, EngineError, ModelError
from areal_tasks.models.dims import ModelDims

if TYPE_CHECKING:
    from areal_tasks.config.micro_batch import MicroBatchSpec

logger = logging.getLogger(__name__)

GIB = 1 << 30
OPTIMIZERS = ("adamw", "adamw_pure", "none")
_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Bytes of one element of ``dtype`` (a torch dtype or a name such as ``"bf16"``)."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {dtype!r}; expected one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU for one train-engine rank; see the module docstring for the formulas."""

    num_params: int
    num_trainable_params: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    #: per token of a micro-batch, logits/CE included, without and with activation checkpointing.
    activation_bytes_per_token_no_ckpt: int
    activation_bytes_per_token_ckpt: int
    #: the logits/cross-entropy share of the above (0 with a chunked CE).
    logits_bytes_per_token: int
    fixed_overhead_bytes: int
    #: transient after the activations are freed: optimizer-step temporaries, FSDP's root gradient.
    late_transient_bytes: int
    gradient_checkpointing: bool
    chunked_ce: bool
    #: the shared weight-update buffer (0 unless the engine publishes through shared memory).
    publish_buffer_bytes: int = 0

    @property
    def static_bytes(self) -> int:
        """Parameters, gradients and optimizer state (and the shared weight-update buffer)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.publish_buffer_bytes

    @property
    def bytes_per_token(self) -> int:
        """Activation bytes per micro-batch token under the chosen checkpointing."""
        if self.gradient_checkpointing:
            return self.activation_bytes_per_token_ckpt
        return self.activation_bytes_per_token_no_ckpt

    def total_bytes(self, n_tokens: int) -> int:
        """Estimated peak bytes when training micro-batches of ``n_tokens`` tokens."""
        during_backward = self.fixed_overhead_bytes + n_tokens * self.bytes_per_token
        return self.static_bytes + max(during_backward, self.late_transient_bytes)


def model_dims(model_config: Any) -> ModelDims:
    """``model_config`` as :class:`ModelDims` (a ``ModelDims``, a config.json dict or an HF config);
    ConfigError when it lacks what the estimate needs."""
    if isinstance(model_config, ModelDims):
        return model_config
    try:
        return ModelDims.from_config(model_config, source="model config")
    except ModelError as exc:
        raise ConfigError(f"{exc} (needed for the memory estimate)") from exc


def estimate_memory(
    model_config: Any,
    *,
    param_dtype: Any = "bfloat16",
    grad_dtype: Any = None,
    compute_dtype: Any = None,
    optimizer: str = "adamw",
    dp: int = 1,
    tp: int = 1,
    sp: int = 1,
    fsdp_shard: bool = True,
    fsdp_wrap: str = "block",
    gradient_checkpointing: bool = False,
    lora_rank: int | None = None,
    ce_chunk_tokens: int | None = None,
    ce_keep_logits: bool = False,
    publish_buffer: bool = False,
) -> MemoryEstimate:
    """Estimate the memory of one GPU of a train engine (formulas in the module docstring).

    ``grad_dtype`` and ``compute_dtype`` default to ``param_dtype``. ``ce_chunk_tokens`` set means a
    chunked/fused cross-entropy that never holds more than that many tokens' logits; with
    ``ce_keep_logits`` it keeps every token's logits (``c V`` bytes a token) for the backward. ``fsdp_wrap``
    is the engine's resolved unit layout: ``block`` or ``root`` when sharded, ``none`` for the
    engine's own flat buffers on one rank
    (``EngineConfig.fsdp_wrap``). ``publish_buffer``: the engine keeps a shared weight-update
    buffer (every published weight in the compute dtype).
    """
    if fsdp_wrap not in ("block", "root", "none"):
        raise ConfigError(f"fsdp_wrap must be block, root or none, got {fsdp_wrap!r}")
    for name, value in (("dp", dp), ("tp", tp), ("sp", sp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if lora_rank is not None and lora_rank < 1:
        raise ConfigError(f"lora_rank must be None or >= 1, got {lora_rank!r}")
    dims = model_dims(model_config)
    p = dtype_bytes(param_dtype)
    gr = dtype_bytes(grad_dtype if grad_dtype is not None else param_dtype)
    c = dtype_bytes(compute_dtype if compute_dtype is not None else param_dtype)
    shard = dp * sp if fsdp_shard else 1
    lora = dims.lora_params(lora_rank) if lora_rank else 0
    n_params = dims.num_params + lora
    n_train = lora if lora_rank else n_params
    per_gpu = tp * shard
    opt_per_param = {"adamw": 8 + (4 if p < 4 else 0), "adamw_pure": 2 * p, "none": 0}[optimizer]
    step_per_param = {"adamw": 4, "adamw_pure": p, "none": 0}[optimizer]

    layer, largest_layer = layer_activation_bytes(dims, c)
    h = dims.hidden_size
    head = h * (4 + c) + c * h
    chunked = ce_chunk_tokens is not None
    if ce_keep_logits and not chunked:
        raise ConfigError("ce_keep_logits needs the chunked cross-entropy (ce_chunk_tokens)")
    if chunked:
        ce_kept, ce_transient = (c * dims.vocab_size if ce_keep_logits else 0), 0
    else:
        ce_kept, ce_transient = 4 * dims.vocab_size, max(8, c + 4) * dims.vocab_size
    no_ckpt = dims.num_layers * layer + head + ce_kept + ce_transient
    ckpt = dims.num_layers * c * h + head + max(ce_kept + ce_transient, largest_layer)
    split = tp * sp

    fixed = 0
    late = -(-n_train * step_per_param // per_gpu)
    if shard == 1 and c < p:
        # one rank per shard group: the root's compute-dtype copy of every parameter lives from the
        # forward to the end of the backward (``build.py``)
        fixed += n_params * c // tp
    if fsdp_wrap == "none":
        # no FSDP (``flat_params.py``): the compute-dtype gradients of a whole backward (a flat buffer,
        # or autograd's own tensors until the kernel adds them into the fp32 masters)
        fixed += n_train * c // tp
    if shard > 1 and fsdp_wrap == "root":
        # one unit: every parameter gathered in c from the forward to the end of the backward; the
        # backward leaves every gradient unsharded in c, reduced through an fp32 copy
        fixed += n_params * c // tp
        late = max(late, n_train * (c + 4) // tp)
    elif shard > 1:
        biggest_layer = max(dims.layer_params(False), dims.layer_params(True) if dims.num_experts else 0)
        fixed += ((dims.root_params + 2 * biggest_layer) * c + biggest_layer * (c + 4)) // tp
        late = max(late, dims.root_params * (c + 4) // tp)
    if chunked:
        fixed += ce_chunk_tokens * dims.vocab_size * (4 + max(8, c + 4)) // split
    return MemoryEstimate(
        num_params=n_params,
        num_trainable_params=n_train,
        param_bytes=-(-n_params * p // per_gpu),
        grad_bytes=-(-n_train * gr // per_gpu),
        optimizer_bytes=-(-n_train * opt_per_param // per_gpu),
        activation_bytes_per_token_no_ckpt=-(-no_ckpt // split),
        activation_bytes_per_token_ckpt=-(-ckpt // split),
        logits_bytes_per_token=(ce_kept + ce_transient) // split,
        fixed_overhead_bytes=fixed,
        late_transient_bytes=late,
        gradient_checkpointing=gradient_checkpointing,
        chunked_ce=chunked,
        publish_buffer_bytes=dims.num_params * c if publish_buffer else 0,
    )


def max_tokens_for_budget(estimate: MemoryEstimate, budget_bytes: int, *, multiple: int = 128) -> int:
    """The largest micro-batch token count (a multiple of ``multiple``) whose estimate fits the budget."""
    if multiple < 1:
        raise ConfigError(f"multiple must be >= 1, got {multiple}")
    room = budget_bytes - estimate.static_bytes - estimate.fixed_overhead_bytes
    tokens = max(room, 0) // estimate.bytes_per_token // multiple * multiple
    if tokens < multiple or estimate.static_bytes + estimate.late_transient_bytes > budget_bytes:
        raise EngineError(
            f"the memory budget of {budget_bytes / GIB:.2f} GiB leaves room for {max(tokens, 0)} tokens per "
            f"micro-batch (static {estimate.static_bytes / GIB:.2f} GiB: params {estimate.param_bytes / GIB:.2f}, "
            f"grads {estimate.grad_bytes / GIB:.2f}, optimizer {estimate.optimizer_bytes / GIB:.2f}, shared "
            f"weight-update buffer {estimate.publish_buffer_bytes / GIB:.2f}; fixed "
            f"{estimate.fixed_overhead_bytes / GIB:.2f} GiB; {estimate.bytes_per_token / 2**20:.2f} MiB per token), "
            f"fewer than {multiple}: shard over more GPUs, enable gradient checkpointing, use a chunked "
            "cross-entropy or raise memory_budget_gb"
        )
    return int(tokens)


def device_memory_budget(fraction: float = 0.9, device: Any = None) -> int:
    """``fraction`` of the CUDA device's memory, less what other processes use there.

    Memory that this process already holds (the model, if loaded) stays in the budget, since the
    estimate counts it. Raises :class:`EngineError` without CUDA.
    """
    if not 0 < fraction <= 1:
        raise ConfigError(f"fraction must be in (0, 1], got {fraction}")
    import torch

    if not torch.cuda.is_available():
        raise EngineError("no CUDA device to read the memory budget from; set micro_batch.memory_budget_gb")
    free, total = torch.cuda.mem_get_info(device)
    used_by_others = max(total - free - torch.cuda.memory_reserved(device), 0)
    return int(fraction * total) - used_by_others


def resolve_max_tokens_per_mb(
    spec: MicroBatchSpec, estimate: MemoryEstimate, *, read_device: bool = False, multiple: int = 128
) -> int | None:
    """The token cap to split with: ``spec.max_tokens_per_mb``, capped by ``spec.memory_budget_gb``
    (GiB) when that is set, else by the device's memory when ``read_device``; ``None`` = no cap."""
    cap = spec.max_tokens_per_mb
    budget = None
    if spec.memory_budget_gb is not None:
        budget = int(spec.memory_budget_gb * GIB)
    elif read_device and cap is None:
        budget = device_memory_budget()
    if budget is None:
        return cap
    fitted = max_tokens_for_budget(estimate, budget, multiple=multiple)
    if cap is not None and cap < fitted:
        return cap
    logger.info("max tokens per micro-batch: %d (memory budget %.1f GiB)", fitted, budget / GIB)
    return fitted


# ------------------------------------------------------------------------------ layout planning

#: fraction of a GPU that allocations can use (the rest: CUDA context, allocator fragmentation).
USABLE_FRACTION = 0.9
#: at most this share of the usable memory may hold inference weights; the rest is KV cache.
INFERENCE_WEIGHT_SHARE = 0.6
#: training-state bytes per parameter with AdamW: bf16 params and grads + fp32 master and two
#: moments (2 + 2 + 12), or fp32 params and grads + two moments (4 + 4 + 8).
TRAIN_STATE_BYTES = 16
#: logits one cross-entropy chunk holds (``chunk x vocabulary``): the chunked LM head
#: (``kernels/lm_head.py``) and this estimate both size their chunks from it; 2**27 fp32 is 512 MiB.
CE_CHUNK_ELEMENTS = 2**27
#: chunk sizes are rounded down to a multiple of this (and never below it).
CE_CHUNK_ALIGN = 64


def chunk_rows(vocab_size: int, total_elements: int = CE_CHUNK_ELEMENTS) -> int:
    """Positions per cross-entropy chunk so that ``chunk x vocab`` stays near ``total_elements``
    (a multiple of :data:`CE_CHUNK_ALIGN`, at least one)."""
    rows = max(CE_CHUNK_ALIGN, total_elements // max(vocab_size, 1))
    return rows // CE_CHUNK_ALIGN * CE_CHUNK_ALIGN


def planning_chunk_tokens(vocab_size: int, tokens_per_gpu: int | None = None) -> int:
    """Tokens per cross-entropy chunk the layout plans with: the engine's chunk, or the whole
    micro-batch when that is smaller."""
    chunk = chunk_rows(vocab_size)
    return chunk if tokens_per_gpu is None else max(1, min(chunk, tokens_per_gpu))


def fsdp_train_bytes(
    dims: ModelDims,
    *,
    dp: int,
    tp: int,
    dtype: str,
    tokens_per_gpu: int,
    chunked_ce: bool = True,
    extra_params: int = 0,
) -> int:
    """Peak bytes of one FSDP training GPU for the layout recommendation: :func:`estimate_memory`
    with activation checkpointing, for micro-batches of ``tokens_per_gpu`` tokens, in the unit
    layout the engine picks (blocks when sharded; one rank: no FSDP without TP, the root unit with
    it). ``chunked_ce``: the engine's chunked LM head computes the cross-entropy (the actor's, where
    the family allows: ``FamilyTraits.plain_lm_head``), else the full-vocabulary term.
    ``extra_params`` (a vision tower) add their training state, sharded like the rest."""
    wrap = "block" if dp > 1 else ("none" if tp == 1 else "root")
    estimate = estimate_memory(
        dims,
        param_dtype=dtype,
        dp=dp,
        tp=tp,
        fsdp_wrap=wrap,
        gradient_checkpointing=True,
        ce_chunk_tokens=planning_chunk_tokens(dims.vocab_size, tokens_per_gpu) if chunked_ce else None,
    )
    return estimate.total_bytes(tokens_per_gpu) + -(-extra_params * TRAIN_STATE_BYTES // (dp * tp))


def inference_weight_bytes(num_params: int, tp: int) -> int:
    """bf16 weights of one inference server rank."""
    return -(-num_params * 2 // tp)


def layer_activation_bytes(dims: ModelDims, c: int) -> tuple[int, int]:
    """Bytes a decoder layer keeps for backward per token: the mean over layers and the largest."""
    h, a, g, d = dims.hidden_size, dims.num_attention_heads, dims.num_kv_heads, dims.head_dim
    norm = h * (4 + c)
    attention = c * h + c * d * (a + 2 * g) + 2 * c * a * d + 4 * a
    if dims.qk_norm:
        attention += d * (a + g) * (4 + c)
    dense_mlp = c * h + 4 * c * dims.intermediate_size
    if not dims.num_experts:
        return 2 * norm + attention + dense_mlp, 2 * norm + attention + dense_mlp
    k = dims.experts_per_token
    moe_mlp = c * h + 8 * dims.num_experts + 2 * c * k * h
    moe_mlp += 4 * c * (k * dims.moe_intermediate_size + dims.shared_expert_intermediate_size)
    mean_mlp = (dims.num_dense_layers * dense_mlp + dims.num_moe_layers * moe_mlp) // dims.num_layers
    return 2 * norm + attention + mean_mlp, 2 * norm + attention + max(dense_mlp, moe_mlp)
