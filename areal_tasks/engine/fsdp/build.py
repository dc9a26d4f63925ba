"""Load an HF model and shard it: LoRA / value head, gradient checkpointing, TP plan, FSDP2.

Master weights are fp32 on every device; the compute dtype comes from the mixed-precision policy
(``dtype="auto"``: bf16 parameters with fp32 gradient reduction on GPU, plain fp32 on CPU).
``fully_shard`` wraps every decoder block, then the root (embeddings, final norm, LM/value head),
or only the root (below).
Attention: see :func:`_attn_implementation` (packed micro-batches need a varlen-capable kernel).
An actor's LM head becomes the chunked fused head before any wrapping (``lm_head.py``).
A vision-language model loads as such (``engine/vision.py``), with data parallelism only; its
vision tower stays in the root unit.
On CUDA the element-wise pieces are compiled before sharding (``compile.py``). Units follow
``EngineConfig.fsdp_wrap`` (:func:`resolve_fsdp_wrap`): with a single rank per shard group (one GPU,
or tp only) only the root is wrapped by default, as there is nothing to shard and per-block hooks
cost host time that a 0.5B model's step cannot hide, and on one GPU (without tp, LoRA or offload)
no FSDP at all: ``fsdp_wrap="none"``, flat master and compute buffers (``flat_params.py``); with
several ranks one unit too when the whole model gathered is small for the GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_tasks.engine.fsdp.compile import (
    blocks_per_graph,
    compile_model,
    resolve_compile_scope,
    should_compile,
)
from areal_tasks.engine.parallel.tensor_parallel import TensorParallel, find_decoder_blocks
from areal_tasks.engine.parallel.ulysses import register_ulysses_attention
from areal_tasks.errors import EngineError
from areal_tasks.kernels.attention import (
    VARLEN_ATTN,
    flash_attn_installed,
    register_varlen_attention,
    varlen_api_available,
)

if TYPE_CHECKING:
    import torch

    from areal_tasks.config.engine import EngineConfig
    from areal_tasks.engine.fsdp.flat_params import FlatParams
    from areal_tasks.engine.parallel.mesh import EngineMesh
    from areal_tasks.kernels.lm_head import ChunkedLMHead

logger = logging.getLogger(__name__)

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


@dataclass
class BuiltModel:
    """The sharded model and what the engine needs to know about it."""

    model: torch.nn.Module
    tensor_parallel: TensorParallel | None
    hf_config: Any
    #: the compute (parameter) dtype name of the mixed-precision policy.
    param_dtype_name: str
    #: the chunked fused LM head (log-probs without full logits), or None: plain logits.
    lm_head: ChunkedLMHead | None = None
    #: modules run through ``torch.compile`` (``compile.py``); empty when eager.
    compiled: list[str] = field(default_factory=list)
    #: why compilation is on or off.
    compile_reason: str = ""
    #: ``blocks`` (whole decoder blocks compiled), ``pointwise`` or ``""`` (eager).
    compile_scope: str = ""
    #: the FSDP2 unit layout built: ``block``, ``root`` or ``none`` (:func:`resolve_fsdp_wrap`).
    fsdp_wrap: str = "block"
    #: with ``none``: the flat master/compute buffers the engine steps through (``flat_params.py``).
    flat: FlatParams | None = None
    #: decoder blocks a compiled graph runs (:func:`blocks_per_graph`; 1 when not grouped).
    blocks_per_graph: int = 1


def compute_dtype_name(dtype: str, device: torch.device) -> str:
    """``auto`` -> bf16 on GPU, fp32 on CPU; else the named dtype."""
    if dtype == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    if dtype not in _DTYPES:
        raise EngineError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return dtype


#: ``fsdp_wrap="auto"`` wraps several ranks' model as one unit when gathering it (every parameter
#: and gradient unsharded) takes at most this fraction of the GPU's memory.
ROOT_WRAP_MAX_FRACTION = 0.05


def resolve_fsdp_wrap(
    wrap: str,
    shard_ranks: int,
    *,
    unsharded_bytes: int | None = None,
    device_bytes: int | None = None,
    flat_capable: bool = False,
) -> str:
    """``block``, ``root`` or ``none`` for ``EngineConfig.fsdp_wrap`` over a shard group of ``shard_ranks``.

    ``auto`` with one rank is ``none`` where the flat buffers can hold the model (``flat_capable``:
    a GPU, no tensor parallelism, LoRA or offload; faster than one FSDP unit on the 0.5B shape),
    else ``root``: nothing is sharded with one rank, so per-block units would only add hooks, casts
    and a reshard that the backward undoes again. With more ranks it is ``root`` when the model is
    small for the GPU: ``unsharded_bytes`` (what one unit holds gathered: parameters in the compute
    dtype and gradients with their fp32 reduce copies) at most :data:`ROOT_WRAP_MAX_FRACTION` of
    ``device_bytes`` (with dp=2 on the 0.5B shape, one unit ran much faster than per-block units).
    Otherwise, and without a GPU's size (CPU), it is ``block``, which keeps one block unsharded at a
    time. The figures: docs/benchmarks_history.md, "Train throughput"."""
    if wrap not in ("auto", "block", "root", "none"):
        raise EngineError(f"fsdp_wrap must be auto, block, root or none, got {wrap!r}")
    if wrap == "none" and shard_ranks != 1:
        raise EngineError(
            f"fsdp_wrap=none keeps whole parameters on one rank, but the shard group (dp x sp) has "
            f"{shard_ranks} ranks; use root or block"
        )
    if wrap != "auto":
        return wrap
    if shard_ranks == 1:
        return "none" if flat_capable else "root"
    small = (
        unsharded_bytes is not None
        and device_bytes is not None
        and unsharded_bytes <= ROOT_WRAP_MAX_FRACTION * device_bytes
    )
    return "root" if small else "block"


def _unsharded_bytes(model: torch.nn.Module, param_dtype: torch.dtype, tp: int) -> int:
    """What one FSDP unit of the whole model holds gathered on a rank: every parameter in the
    compute dtype, every gradient in it and in fp32 for the reduction (``N (2 c + 4) / tp``)."""
    params = sum(p.numel() for p in model.parameters())  # a DTensor counts its global size
    return params * (2 * param_dtype.itemsize + 4) // max(tp, 1)


def gpu_memory_bytes(device: torch.device) -> int | None:
    """The GPU's total memory, or None on the CPU."""
    import torch

    if device.type != "cuda":
        return None
    return int(torch.cuda.get_device_properties(device).total_memory)


def _attn_implementation(requested: str | None, sp: int, device: torch.device) -> str:
    """The attention the model is loaded with.

    ``sp > 1``: the Ulysses attention. Otherwise the requested one, or by default: flash-attn's
    ``flash_attention_2`` on CUDA when installed, else the engine's ``areal_varlen`` (on CUDA torch's
    varlen flash kernel, on CPU one SDPA call per sequence; see ``attention.py``), else (CUDA with a
    torch without the varlen API) transformers' ``sdpa``, which builds the block-diagonal mask from
    the packed position ids.
    """
    if sp > 1:
        if requested not in (None, "sdpa", "flash_attention_2", VARLEN_ATTN):
            raise EngineError(f"sequence parallelism brings its own attention; attn_implementation={requested!r}")
        return register_ulysses_attention()
    if requested == VARLEN_ATTN:
        return register_varlen_attention()
    if requested is not None:
        return requested
    if device.type == "cuda" and flash_attn_installed():
        return "flash_attention_2"
    if device.type != "cuda" or varlen_api_available():
        return register_varlen_attention()
    return "sdpa"


def _load(path: str, role: str, attn: str, dims: Any) -> torch.nn.Module:
    """The HF model at ``path`` in fp32: a causal LM, a critic (value head), or a vision-language
    model (``engine/vision.py``: its language model gets ``attn``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from areal_tasks.engine.vision import is_vision_language, load_vision_language

    if is_vision_language(AutoConfig.from_pretrained(path)):
        if role == "critic":
            raise EngineError(f"{path}: a value head on a vision-language model is not supported; use a text critic")
        if dims.tp > 1 or dims.sp > 1:
            raise EngineError(
                f"{path}: vision-language models train with data parallelism only (got tp={dims.tp}, sp={dims.sp})"
            )
        return load_vision_language(path, attn, torch.float32)
    kwargs = {"dtype": torch.float32, "attn_implementation": attn}
    if role == "critic":
        from areal_tasks.models.critic import load_critic

        return load_critic(path, **kwargs)
    return AutoModelForCausalLM.from_pretrained(path, **kwargs)


def build_model(
    config: EngineConfig,
    model_path: str,
    mesh: EngineMesh,
    device: torch.device,
    *,
    role: str,
    trainable: bool,
    attn_implementation: str | None = None,
    chunked_lm_head: bool = True,
    seed: int = 1,
) -> BuiltModel:
    """Load ``model_path`` and return it sharded over ``mesh`` (see the module docstring).

    ``chunked_lm_head``: for an actor, swap the LM head for the chunked fused one
    (:mod:`areal_tasks.kernels.lm_head`) when the model qualifies.
    """
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    dims = mesh.dims
    attn = _attn_implementation(attn_implementation, dims.sp, device)
    model = _load(model_path, role, attn, dims)
    hf_config = model.config
    if config.freeze_vision:
        from areal_tasks.engine.vision import freeze_vision_tower

        freeze_vision_tower(model, model_path)
    lm_head = None
    if chunked_lm_head and role == "actor":
        from areal_tasks.kernels.lm_head import install_chunked_head

        lora_targets = config.lora.target_modules if config.lora.enabled else None
        # whether it keeps the logits is settled with the micro-batch token cap (``engine.py``)
        lm_head = install_chunked_head(model, lora_targets=lora_targets)
    if config.gradient_checkpointing and trainable:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.lora.enabled:
        if dims.tp > 1:
            raise EngineError("LoRA with tensor parallelism (tp > 1) is not supported; use dp/sp with LoRA")
        from areal_tasks.models.lora import apply_lora

        model = apply_lora(model, config.lora, seed)
    if not trainable:
        model.requires_grad_(False)
    tensor_parallel = None
    if dims.tp > 1:
        tensor_parallel = TensorParallel(mesh.tp_mesh)
        tensor_parallel.apply(model)
    dtype_name = compute_dtype_name(config.dtype, device)
    param_dtype = getattr(torch, dtype_name)
    mp = MixedPrecisionPolicy(
        param_dtype=None if param_dtype == torch.float32 else param_dtype, reduce_dtype=torch.float32
    )
    # pinned host memory needs CUDA; on CPU the policy still keeps shards and optimizer state on the host
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if config.cpu_offload else OffloadPolicy()
    wrap = resolve_fsdp_wrap(
        config.fsdp_wrap,
        mesh.fsdp_mesh.size(),
        unsharded_bytes=_unsharded_bytes(model, param_dtype, dims.tp),
        device_bytes=gpu_memory_bytes(device) if not config.cpu_offload else None,
        flat_capable=device.type == "cuda" and not _flat_blockers(config, dims),
    )
    # Root-only: one unit, gathered once per forward and kept for the backward (a reshard there
    # would only be undone by the backward's all-gather).
    shard_kwargs = {
        "mesh": mesh.fsdp_mesh,
        "mp_policy": mp,
        "offload_policy": offload,
        "reshard_after_forward": wrap == "block",
    }
    blocks = find_decoder_blocks(model)
    do_compile, compile_reason = should_compile(config.compile, device, tp=dims.tp, lora=config.lora.enabled)
    scope = (
        resolve_compile_scope(config.compile_scope, attn_implementation=attn, sp=dims.sp, device_type=device.type)
        if do_compile
        else ""
    )
    per_graph = blocks_per_graph(
        config.compile_blocks_per_graph,
        scope=scope,
        fsdp_wrap=wrap,
        layer_types=getattr(hf_config, "layer_types", None),
        num_blocks=len(blocks),
    )
    compiled = (
        compile_model(model, blocks, chunked_head=lm_head, scope=scope, blocks_per_graph=per_graph)
        if do_compile
        else []
    )
    flat = None
    if wrap == "none":
        flat = _flatten(model, config, dims, device, param_dtype, trainable)
    else:
        if wrap == "block":
            for block in blocks:
                fully_shard(block, **shard_kwargs)
        fully_shard(model, **shard_kwargs)  # also moves parameters and buffers to the mesh's device
    n_params = sum(p.numel() for p in model.parameters())
    logger.info(
        "model %s: %d parameters (sharded view), compute dtype %s, FSDP units: %s",
        type(model).__name__,
        n_params,
        dtype_name,
        wrap,
    )
    return BuiltModel(
        model=model,
        tensor_parallel=tensor_parallel,
        hf_config=hf_config,
        param_dtype_name=dtype_name,
        lm_head=lm_head,
        compiled=compiled,
        compile_reason=compile_reason,
        fsdp_wrap=wrap,
        compile_scope=scope,
        flat=flat,
        blocks_per_graph=per_graph,
    )


def _flatten(
    model: torch.nn.Module,
    config: EngineConfig,
    dims: Any,
    device: torch.device,
    param_dtype: torch.dtype,
    trainable: bool,
) -> FlatParams:
    """``fsdp_wrap=none``: the model on ``device`` with its parameters in flat buffers (refusing
    what they cannot hold)."""
    from areal_tasks.engine.fsdp.flat_params import FlatParams

    blockers = _flat_blockers(config, dims)
    if blockers:
        raise EngineError(f"fsdp_wrap=none does not support {blockers[0]}; use fsdp_wrap=root")
    model.to(device)
    return FlatParams(model, param_dtype, trainable=trainable)


def _flat_blockers(config: EngineConfig, dims: Any) -> list[str]:
    """What keeps a model out of the flat buffers of ``fsdp_wrap=none`` (empty when they can hold
    it): ``fsdp_wrap=auto`` picks them on a GPU only when nothing does, and ``none`` refuses the first."""
    return [
        name
        for name, present in (
            ("tensor parallelism (tp > 1)", dims.tp > 1),
            ("LoRA", config.lora.enabled),
            ("cpu_offload", config.cpu_offload),
        )
        if present
    ]
