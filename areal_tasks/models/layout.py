"""``recommend_layout``: a first allocation spec for a model on a number of GPUs.

Rules (deliberately simple; the per-GPU memory figures come from the one estimator,
:mod:`areal_tasks.models.memory`, the same the FSDP engine sizes its micro-batches with):

1. GPUs are split between inference and training, half and half (training gets the odd one).
   One GPU cannot be split and colocating both on it is not supported, so with 0 or 1 GPUs the
   recommendation is the CPU layout ``embedded:d1+fsdp:d1`` (fine for tiny models and the demo).
2. MoE models of the families the archon engine defines (:data:`ARCHON_MOE_FAMILIES`) train with
   archon and expert parallelism: ``archon:d{dp}e{ep}``, EP the largest power of two dividing the
   expert count and ``dp * cp`` (archon splits experts over the data- and context-parallel ranks).
   The archon estimate (:mod:`areal_tasks.models.memory_archon`: fp32 states sharded over every
   data-parallel rank, experts over EP, no activation recomputation) decides. When ``d x e`` does not
   fit, pipeline stages are tried (``p`` = 2, 4, ... dividing the training GPUs, at most one stage a
   layer), then Ulysses ``c`` alone (dividing the attention heads). Never ``t``: archon runs the MoE
   layers whole on every tensor-parallel rank, so ``t`` splits no expert. Other MoE families (DeepSeek)
   are planned like dense models on FSDP, which holds every expert on every rank.
3. Dense models train with FSDP over all training GPUs when the engine's estimate (sharded states,
   gathered layers, activations with checkpointing) fits; otherwise the TP degree is raised
   (powers of two dividing the attention and KV heads, at most 8) until it does.
4. Inference uses the smallest TP (power of two dividing the heads, at most 8) whose bf16 weights
   leave room for the KV cache; the remaining factor is data parallel.

When nothing fits, the largest layout is returned with ``fits=False`` and the reasons say why.
The allocation strings follow ``docs/allocation.md`` (``e`` divides ``d x c``; omitted dims are 1);
``tests/unit/models/test_layout_archon.py`` checks every MoE recommendation against the archon
engine's own layout checker.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models import memory as mem
from areal_tasks.models import memory_archon
from areal_tasks.models.families import traits
from areal_tasks.models.info import ModelInfo

logger = logging.getLogger(__name__)

MAX_TP = 8
#: the training dtypes a recommendation can plan for.
TRAIN_DTYPES = ("bfloat16", "float16", "float32")
#: parameters above which CPU training is impractically slow
CPU_PRACTICAL_PARAMETERS = 1_000_000_000
#: the MoE families the archon engine defines (``engine/archon/layout.py``'s ``MOE_FAMILIES``; a
#: test keeps the two equal).
ARCHON_MOE_FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral")
#: the largest Ulysses degree the MoE plan tries.
MAX_CP = 8


@dataclass
class LayoutRecommendation:
    """A recommended split and parallelism, as an allocation spec plus its parts."""

    train_backend: str
    allocation: str
    inference_backend: str
    device: str
    n_inference_gpus: int
    n_train_gpus: int
    inference_tp: int
    inference_dp: int
    train_dp: int
    train_tp: int
    train_ep: int
    fits: bool
    reasons: list[str] = field(default_factory=list)
    train_gib_per_gpu: float = 0.0
    inference_weights_gib_per_gpu: float = 0.0
    train_pp: int = 1
    train_cp: int = 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


def _dims(d: int, t: int = 1, e: int = 1, p: int = 1, c: int = 1) -> str:
    """``d4t2p2c2e4`` in the grammar's order, dims of 1 left out (``d`` always written)."""
    return f"d{d}" + "".join(f"{name}{size}" for name, size in (("t", t), ("p", p), ("c", c), ("e", e)) if size > 1)


def _tp_candidates(info: ModelInfo, n: int, need_kv: bool) -> list[int]:
    """Powers of two up to min(MAX_TP, n) dividing ``n``, the attention heads and (training) the KV heads."""
    out = []
    tp = 1
    while tp <= min(MAX_TP, n):
        heads_ok = info.dims.num_attention_heads % tp == 0 and (not need_kv or info.dims.num_kv_heads % tp == 0)
        if n % tp == 0 and heads_ok:
            out.append(tp)
        tp *= 2
    return out


def _largest_power_of_two_dividing(*values: int) -> int:
    g = 0
    for value in values:
        g = math.gcd(g, value)
    return g & -g if g > 0 else 1


def _cpu_layout(info: ModelInfo, n_gpus: int) -> LayoutRecommendation:
    reasons = []
    if n_gpus == 1:
        reasons.append(
            "one GPU cannot be split between inference and training, and colocating both on one GPU is not "
            "supported; with 2 GPUs use 'sglang:d1+fsdp:d1'. Until then: the embedded CPU layout"
        )
    else:
        reasons.append("no GPUs: embedded inference server and FSDP on gloo, both on CPU")
    fits = info.num_parameters <= CPU_PRACTICAL_PARAMETERS
    if not fits:
        reasons.append(
            f"{info.num_parameters / 1e9:.1f}B parameters is too large to train on CPU in practice "
            f"(limit ~{CPU_PRACTICAL_PARAMETERS / 1e9:.0f}B); use at least 2 GPUs"
        )
    return LayoutRecommendation(
        train_backend="fsdp",
        allocation="embedded:d1+fsdp:d1",
        inference_backend="embedded",
        device="cpu",
        n_inference_gpus=0,
        n_train_gpus=0,
        inference_tp=1,
        inference_dp=1,
        train_dp=1,
        train_tp=1,
        train_ep=1,
        fits=fits,
        reasons=reasons,
    )


def _plan_inference(info: ModelInfo, n_infer: int, usable: float, reasons: list[str]) -> tuple[int, bool]:
    budget = usable * mem.INFERENCE_WEIGHT_SHARE
    candidates = _tp_candidates(info, n_infer, need_kv=False) or [1]
    for tp in candidates:
        weights = mem.inference_weight_bytes(info.num_parameters, tp)
        if weights <= budget:
            reasons.append(
                f"inference: tp={tp} puts {weights / mem.GIB:.1f} GiB of bf16 weights on "
                f"each GPU (<= {mem.INFERENCE_WEIGHT_SHARE:.0%} of usable memory, the rest for KV cache); "
                f"dp={n_infer // tp}"
            )
            return tp, True
    tp = candidates[-1]
    reasons.append(
        f"inference: even tp={tp} needs {mem.inference_weight_bytes(info.num_parameters, tp) / mem.GIB:.1f} GiB "
        f"of weights per GPU, over the {budget / mem.GIB:.1f} GiB budget; give inference more GPUs or larger ones"
    )
    return tp, False


def _fsdp_bytes(info: ModelInfo, n_train: int, tp: int, dtype: str, tokens: int) -> int:
    return mem.fsdp_train_bytes(
        info.dims,
        dp=n_train // tp,
        tp=tp,
        dtype=dtype,
        tokens_per_gpu=tokens,
        chunked_ce=traits(info.family).plain_lm_head,
        extra_params=info.num_vision_parameters,
    )


def _plan_dense(
    info: ModelInfo, n_train: int, usable: float, dtype: str, tokens: int, reasons: list[str]
) -> tuple[int, bool, float]:
    candidates = _tp_candidates(info, n_train, need_kv=True) or [1]
    for tp in candidates:
        need = _fsdp_bytes(info, n_train, tp, dtype, tokens)
        if need <= usable:
            why = "fits with pure data parallelism" if tp == 1 else f"needs tp={tp} to fit (activations split by TP)"
            kind = "MoE" if info.is_moe else "dense"
            reasons.append(
                f"train: {kind} model -> fsdp; ~{need / mem.GIB:.1f} GiB per GPU ({mem.TRAIN_STATE_BYTES} B/param of "
                f"sharded params, grads and AdamW states over {n_train} GPUs, plus gathered layers and activations "
                f"with checkpointing): {why}"
            )
            return tp, True, need
    tp = candidates[-1]
    need = _fsdp_bytes(info, n_train, tp, dtype, tokens)
    min_gpus = math.ceil(info.num_parameters * mem.TRAIN_STATE_BYTES / usable)
    reasons.append(
        f"train: does not fit: ~{need / mem.GIB:.1f} GiB per GPU at tp={tp} exceeds {usable / mem.GIB:.1f} GiB usable; "
        f"the optimizer states alone need more than {min_gpus} training GPUs of this size"
    )
    return tp, False, need


@dataclass(frozen=True)
class _ArchonPlan:
    dp: int
    pp: int
    cp: int
    ep: int
    need: int

    @property
    def spec(self) -> str:
        return _dims(self.dp, e=self.ep, p=self.pp, c=self.cp)


def _archon_shapes(info: ModelInfo, n_train: int) -> list[tuple[int, int]]:
    """``(pp, cp)`` in the order tried: neither, then pipeline stages, then Ulysses."""
    dims = info.dims
    shapes = [(1, 1)]
    pp = 2
    while pp <= n_train and pp <= dims.num_layers:
        if n_train % pp == 0:
            shapes.append((pp, 1))
        pp *= 2
    cp = 2
    while cp <= min(n_train, MAX_CP):
        if n_train % cp == 0 and dims.num_attention_heads % cp == 0:
            shapes.append((1, cp))
        cp *= 2
    return shapes


def _plan_archon(info: ModelInfo, n_train: int, usable: float, dtype: str, tokens: int) -> tuple[_ArchonPlan, bool]:
    dims = info.dims
    plans = []
    for pp, cp in _archon_shapes(info, n_train):
        dp = n_train // (pp * cp)
        ep = _largest_power_of_two_dividing(dims.num_experts, dp * cp)
        need = memory_archon.archon_train_bytes(
            dims,
            dp=dp,
            pp=pp,
            cp=cp,
            ep=ep,
            dtype=dtype,
            tokens_per_gpu=tokens,
            extra_params=info.num_vision_parameters,
        )
        plan = _ArchonPlan(dp=dp, pp=pp, cp=cp, ep=ep, need=need)
        if need <= usable:
            return plan, True
        plans.append(plan)
    return plans[0], False  # d x e: the layout to shrink the micro-batches at


def _archon_reason(info: ModelInfo, plan: _ArchonPlan, fits: bool, usable: float, dtype: str, tokens: int) -> str:
    dims = info.dims
    head = (
        f"train: MoE ({dims.num_experts} experts, top-{dims.experts_per_token}) -> archon:{plan.spec}: expert "
        f"parallelism ep={plan.ep} (largest power of two dividing the experts and the {plan.dp * plan.cp} data-"
        f"parallel ranks; no t: it would run the MoE layers whole on every tensor-parallel rank)"
    )
    extra = []
    if plan.pp > 1:
        extra.append(f"p={plan.pp} pipeline stages because d x e alone does not fit")
    if plan.cp > 1:
        extra.append(f"Ulysses c={plan.cp} splits the {tokens}-token micro-batches because d x e and p do not fit")
    head += "".join(f"; {text}" for text in extra)
    figures = (
        f"~{plan.need / mem.GIB:.1f} GiB per GPU ({memory_archon.ARCHON_STATE_BYTES} B/param of fp32 params, grads "
        f"and AdamW states sharded over every data-parallel rank, experts over ep, plus activations of "
        f"{tokens}-token micro-batches, which archon does not recompute)"
    )
    if fits:
        return f"{head}: {figures}"
    during, _ = memory_archon.archon_static_bytes(
        dims, dp=plan.dp, pp=plan.pp, cp=plan.cp, ep=plan.ep, dtype=dtype, extra_params=info.num_vision_parameters
    )
    per_token = memory_archon.archon_bytes_per_token(dims, dtype=dtype, pp=plan.pp, cp=plan.cp)
    room = int((usable - during) // per_token)
    advice = (
        f"at this layout micro-batches of at most ~{room} tokens fit (micro_batch.max_tokens_per_mb); "
        "or add GPUs (p and c did not make it fit either)"
        if room > 0
        else "the states alone exceed it: add training GPUs"
    )
    return f"{head}: does not fit: {figures} exceeds {usable / mem.GIB:.1f} GiB usable; {advice}"


def recommend_layout(
    info: ModelInfo,
    n_gpus: int,
    gpu_memory_gb: float = 80.0,
    train_dtype: str = "bfloat16",
    *,
    tokens_per_gpu: int = 16384,
) -> LayoutRecommendation:
    """Recommend an inference/training split and parallelism for ``info`` on ``n_gpus`` GPUs.

    ``gpu_memory_gb`` is each GPU's memory (GB as vendors quote it: 80 for an A100/H100-80G);
    ``tokens_per_gpu`` is the training micro-batch size in tokens used for the activation estimate.
    """
    if n_gpus < 0:
        raise ModelError(f"n_gpus={n_gpus} must be >= 0 (0 means CPU only)")
    if gpu_memory_gb <= 0:
        raise ModelError(f"gpu_memory_gb={gpu_memory_gb} must be positive (e.g. 80 for an 80 GB GPU)")
    if train_dtype not in TRAIN_DTYPES:
        raise ModelError(f"train_dtype={train_dtype!r} is not supported; use one of {', '.join(TRAIN_DTYPES)}")
    if n_gpus <= 1:
        return _cpu_layout(info, n_gpus)
    n_infer = n_gpus // 2
    n_train = n_gpus - n_infer
    usable = gpu_memory_gb * 1e9 * mem.USABLE_FRACTION
    reasons = [f"split {n_gpus} GPUs: {n_infer} for inference, {n_train} for training"]
    infer_tp, infer_fits = _plan_inference(info, n_infer, usable, reasons)
    infer_dims = _dims(n_infer // infer_tp, infer_tp)
    pp = cp = 1
    if info.is_moe and info.dims.family in ARCHON_MOE_FAMILIES:
        plan, train_fits = _plan_archon(info, n_train, usable, train_dtype, tokens_per_gpu)
        reasons.append(_archon_reason(info, plan, train_fits, usable, train_dtype, tokens_per_gpu))
        backend, train_spec, need = "archon", plan.spec, plan.need
        dp, tp, pp, cp, ep = plan.dp, 1, plan.pp, plan.cp, plan.ep
    else:
        if info.is_moe:
            reasons.append(
                f"train: the archon engine does not define {info.dims.family!r} (it runs "
                f"{', '.join(ARCHON_MOE_FAMILIES)} among MoE families): fsdp, every expert on every rank"
            )
        tp, train_fits, need = _plan_dense(info, n_train, usable, train_dtype, tokens_per_gpu, reasons)
        backend, dp, ep = "fsdp", n_train // tp, 1
        train_spec = _dims(dp, tp)
    recommendation = LayoutRecommendation(
        train_backend=backend,
        allocation=f"sglang:{infer_dims}+{backend}:{train_spec}",
        inference_backend="sglang",
        device="cuda",
        n_inference_gpus=n_infer,
        n_train_gpus=n_train,
        inference_tp=infer_tp,
        inference_dp=n_infer // infer_tp,
        train_dp=dp,
        train_tp=tp,
        train_ep=ep,
        fits=infer_fits and train_fits,
        reasons=reasons,
        train_gib_per_gpu=round(need / mem.GIB, 2),
        inference_weights_gib_per_gpu=round(mem.inference_weight_bytes(info.num_parameters, infer_tp) / mem.GIB, 2),
        train_pp=pp,
        train_cp=cp,
    )
    logger.debug("layout for %s on %d GPUs: %s", info.family, n_gpus, recommendation.allocation)
    return recommendation
