"""Chunked fused LM head: per-token log-probs (and entropies) without the logits of a micro-batch.

The plain path computes ``logits = hidden @ W^T`` for the whole micro-batch (``tokens x vocabulary``
in the compute dtype: gigabytes at a 150K-token vocabulary) and then scores it; autograd keeps the
logits and fp32 chunks of them for the backward. :func:`chunked_next_token_stats` instead runs, for
``chunk`` positions at a time, the matmul, the fp32 log-sum-exp, the gather of the label's logit and
the entropy, and keeps only ``[N]`` vectors (log-sum-exp, entropy) for the backward, which
recomputes each chunk's logits (:class:`_ChunkedStats`, a custom autograd function). The
element-wise work on a chunk's logits lives in two pure functions (:func:`chunk_forward_stats`,
:func:`chunk_logit_grad`); on CUDA the engine swaps in faster versions
(:func:`compile_chunk_kernels`): two Triton kernels that read each chunk's bf16 logits once
(``lm_head_kernels.py``), or the pure functions fused by ``torch.compile``, instead of writing and
re-reading fp32 copies per operation, which profiling showed to cost more than the matmuls at large
vocabularies. Eager, a chunk's peak extra memory is a few fp32 ``chunk x vocab`` temporaries
(``CHUNK_ELEMENTS`` bounds one to 512 MiB). The weight gradient is accumulated in fp32 and rounded
once, like the single matmul of the plain path.

FSDP2: the head's weight is a parameter of the root FSDP module (with the embeddings and the final
norm; tied to the input embeddings in some models), which is unsharded only inside the root's
forward. So the scoring happens *inside* the model's forward: :func:`install_chunked_head`
replaces the model's ``lm_head`` ``nn.Linear`` by :class:`ChunkedLMHead`, which holds the very same
parameter objects (ties, state-dict keys, checkpoints and weight export are unchanged) and behaves
as the plain linear layer unless :meth:`ChunkedLMHead.scoring` is active; then the model's
``logits`` output is ``[B, S, 2]`` (log-prob, entropy) or ``[B, S, 1]`` (log-prob only) in fp32.

Where it applies: the causal LMs whose forward is exactly ``logits = lm_head(hidden)`` (the families
in :data:`PLAIN_HEAD_FAMILIES`; others may scale or soft-cap logits after the head, and keep the
plain path). Tensor parallelism keeps the LM head replicated (``engine/parallel/tensor_parallel.py``), so the
chunked head works with ``tp > 1`` unchanged. Not for the critic (its head has one output), nor
when LoRA targets the LM head (peft would have to wrap it).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from areal_tasks.errors import EngineError
from areal_tasks.models.families import FAMILIES
from areal_tasks.models.memory import CE_CHUNK_ELEMENTS, chunk_rows

logger = logging.getLogger(__name__)

#: model types whose causal-LM forward is ``logits = self.lm_head(hidden_states)`` with nothing after
#: (the model kit's ``FamilyTraits.plain_lm_head``).
PLAIN_HEAD_FAMILIES = tuple(name for name, family in FAMILIES.items() if family.plain_lm_head)

#: target size of one chunk's ``[chunk, vocab]`` score matrix (elements): the memory estimate's.
CHUNK_ELEMENTS = CE_CHUNK_ELEMENTS
#: the same with the chunk kernels compiled (no fp32 copies of a chunk: its bf16 logits and their
#: gradient, 0.5 GiB each at 2**28). Larger chunks run faster, since more rows per chunk keep more
#: SMs busy in the row reductions; past 2**28 the gain at Qwen2.5's vocabulary no longer pays for
#: the extra peak memory (``benchmarks/lm_head_chunks.py``; docs/benchmarks.md, "LM head").
COMPILED_CHUNK_ELEMENTS = 2**28


#: ``EngineConfig.lm_head_keep_logits=auto`` keeps a micro-batch's logits when, at the token cap,
#: they take at most this share of the GPU's memory (16K tokens of Qwen2.5's vocabulary in bf16,
#: 5 GB, are 3.6% of an H200).
AUTO_KEEP_LOGITS_MAX_FRACTION = 0.05


def auto_keep_logits(*, token_cap: int | None, vocab_size: int, itemsize: int, device_bytes: int | None) -> bool:
    """``lm_head_keep_logits=auto``: whether a micro-batch of at most ``token_cap`` tokens may keep
    its logits (``token_cap x vocab_size x itemsize`` bytes) on a device of ``device_bytes``. No cap
    (micro-batches of any length) or no GPU size (the CPU) keeps nothing."""
    if token_cap is None or device_bytes is None:
        return False
    return token_cap * vocab_size * itemsize <= AUTO_KEEP_LOGITS_MAX_FRACTION * device_bytes


def default_chunk_size(vocab_size: int, total_elements: int = CHUNK_ELEMENTS) -> int:
    """Positions per chunk so that ``chunk x vocab`` stays near ``total_elements``."""
    return chunk_rows(vocab_size, total_elements)


def chunk_forward_stats(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log Z, log-prob of the label, entropy or an empty tensor)`` of one chunk's ``[n, V]`` logits.

    Pure element-wise work and row reductions over the logits, so that under ``torch.compile`` it
    becomes a couple of fused kernels reading the bf16 logits once or twice, instead of an fp32 copy
    and a pass per operation.
    """
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    log_z = torch.logsumexp(scores, dim=-1)
    logprob = scores.gather(-1, labels[:, None]).squeeze(-1) - log_z
    # H = log Z - sum_j p_j z_j
    entropy = log_z - (torch.exp(scores - log_z[:, None]) * scores).sum(-1) if with_entropy else log_z.new_empty(0)
    return log_z, logprob, entropy


def chunk_logit_grad(
    logits: torch.Tensor,
    labels: torch.Tensor,
    log_z: torch.Tensor,
    entropy: torch.Tensor,
    g_logprob: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    temperature: float,
) -> torch.Tensor:
    """The gradient with respect to one chunk's logits, in the logits' dtype.

    ``d logprob / dz = onehot(label) - p``; ``d entropy / dz = -p * (z - log Z + H)`` (``z`` the
    tempered scores), both divided by the temperature. The one-hot term is added in fp32 before the
    single rounding, so confident tokens (``p`` near 1) keep their small ``g * (1 - p)``.
    """
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    lz = log_z[:, None]
    probs = torch.exp(scores - lz)
    grad = torch.zeros_like(scores)
    if g_entropy is not None:
        grad = grad - (scores - lz + entropy[:, None]) * probs * g_entropy[:, None]
    if g_logprob is not None:
        onehot = torch.arange(scores.shape[-1], device=scores.device)[None, :] == labels[:, None]
        grad = grad + (onehot.to(scores.dtype) - probs) * g_logprob[:, None]
    if temperature != 1.0:
        grad = grad / temperature
    return grad.to(logits.dtype)


def _in_place(grad_fn: Any) -> Any:
    """``grad_fn``'s gradient written over the logits it was computed from (a copy back)."""

    def run(logits: torch.Tensor, *args: Any) -> torch.Tensor:
        return logits.copy_(grad_fn(logits, *args))

    return run


def eager_kernels() -> dict[str, Any]:
    """The pure chunk functions, run eagerly (what :data:`_kernels` starts as)."""
    return {
        "forward": chunk_forward_stats,
        "grad": chunk_logit_grad,
        "grad_in_place": _in_place(chunk_logit_grad),
        "kind": "eager",
    }


#: the chunk functions actually called: set by :func:`compile_chunk_kernels` (CUDA), else eager.
#: ``grad_in_place`` writes the gradient over the logits (the kept-logits backward).
_kernels: dict[str, Any] = eager_kernels()


def compile_chunk_kernels(triton: bool | None = None) -> str:
    """Use fast chunk kernels from now on (once per process; idempotent); returns which.

    ``triton`` (default: where Triton imports and CUDA is present): the hand-written kernels of
    :mod:`~areal_tasks.kernels.lm_head_kernels` for CUDA logits, each reading a chunk once.
    Otherwise, or for logits on another device, the pure functions above through ``torch.compile``,
    with dynamic shapes (the last chunk of a micro-batch is shorter, and one compiled kernel serves
    both).
    """
    from areal_tasks.kernels import lm_head_kernels

    use_triton = lm_head_kernels.kernels_available() if triton is None else triton
    if use_triton and not lm_head_kernels.kernels_available():
        raise EngineError("the LM head's Triton kernels need CUDA and the triton package")
    kind = "triton" if use_triton else "inductor"
    if _kernels.get("kind") == kind:
        return kind
    forward = torch.compile(chunk_forward_stats, dynamic=True)
    grad = torch.compile(chunk_logit_grad, dynamic=True)
    grad_in_place = _in_place(grad)  # the compiled function stays pure: the copy back runs outside it
    if use_triton:
        forward = _on_cuda(lm_head_kernels.forward_stats, otherwise=forward)
        grad = _on_cuda(lm_head_kernels.logit_grad, otherwise=grad)
        grad_in_place = _on_cuda(lm_head_kernels.logit_grad_in_place, otherwise=grad_in_place)
    _kernels.update(forward=forward, grad=grad, grad_in_place=grad_in_place, kind=kind)
    logger.info("chunked LM head: element-wise chunk work by %s kernels", kind)
    return kind


def chunk_kernels_kind() -> str:
    """Which chunk kernels the head runs: ``eager``, ``inductor`` or ``triton``."""
    return str(_kernels["kind"])


def _on_cuda(kernel: Any, *, otherwise: Any) -> Any:
    """``kernel`` for CUDA logits (the first argument), ``otherwise`` for the rest."""

    def run(logits: torch.Tensor, *args: Any) -> Any:
        return (kernel if logits.is_cuda else otherwise)(logits, *args)

    return run


def accumulate_matmul(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with ``acc`` fp32 and ``a``/``b`` possibly bf16/fp16.

    On CUDA the matmul writes straight into the fp32 accumulator (``addmm`` with ``out_dtype``: one
    GEMM). Otherwise a half-precision product is materialised and added, which for the LM head's
    ``[V, H]`` weight gradient is a 0.3 GB write plus a 1.4 GB read-modify-write per chunk.
    """
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda and acc.dtype == torch.float32 and a.dtype in (torch.bfloat16, torch.float16):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.add_(torch.matmul(a, b))  # promotes into the accumulator


def _linear_into(out: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``out = hidden @ weight^T (+ bias)``, written into ``out`` (a row block of the kept logits)."""
    if bias is None:
        torch.matmul(hidden, weight.t(), out=out)
    else:
        torch.addmm(bias, hidden, weight.t(), out=out)


class _ChunkedStats(torch.autograd.Function):
    """``(logprob [N], entropy [N] or empty)`` of ``hidden [N, H]`` against ``labels [N]``."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        labels: torch.Tensor,
        temperature: float,
        chunk: int,
        with_entropy: bool,
        entropy_grad: bool,
        keep_logits: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        forward_stats = _kernels["forward"]
        parts = []
        # kept: the micro-batch's logits in one [N, V] buffer, written by one matmul, which the
        # backward turns into their gradient in place (no second matmul, no second buffer)
        kept = None
        if keep_logits:
            kept = torch.empty(
                (hidden.shape[0], weight.shape[0]), dtype=torch.result_type(hidden, weight), device=hidden.device
            )
            _linear_into(kept, hidden, weight, bias)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = torch.nn.functional.linear(hidden[rows], weight, bias) if kept is None else kept[rows]
            parts.append(forward_stats(logits, labels[rows], temperature, with_entropy))
            del logits
        log_z, logprob, entropy = (torch.cat(p) for p in zip(*parts))
        ctx.save_for_backward(hidden, weight, bias, labels, log_z, entropy, kept)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.entropy_grad = with_entropy and entropy_grad
        if not ctx.entropy_grad:
            ctx.mark_non_differentiable(entropy)
        ctx.set_materialize_grads(False)
        return logprob, entropy

    @staticmethod
    def backward(
        ctx: Any, g_logprob: torch.Tensor | None, g_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, labels, log_z, entropy, kept = ctx.saved_tensors
        if not ctx.entropy_grad:
            g_entropy = None
        nones = (None,) * 6
        if g_logprob is None and g_entropy is None:
            return None, None, None, *nones
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if kept is not None:
            return (
                *_kept_logits_backward(
                    ctx,
                    kept,
                    hidden,
                    weight,
                    bias,
                    labels,
                    log_z,
                    entropy,
                    g_logprob,
                    g_entropy,
                    (need_h, need_w, need_b),
                ),
                *nones,
            )
        logit_grad = _kernels["grad"]
        grad_h = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h = hidden[rows]
            logits = torch.nn.functional.linear(h, weight, bias)
            grad = logit_grad(
                logits,
                labels[rows],
                log_z[rows],
                entropy[rows],
                None if g_logprob is None else g_logprob[rows],
                None if g_entropy is None else g_entropy[rows],
                ctx.temperature,
            )
            del logits
            if grad_h is not None:
                torch.matmul(grad, weight, out=grad_h[rows])
            if grad_w is not None:
                accumulate_matmul(grad_w, grad.t(), h)
            if grad_b is not None:
                grad_b += grad.float().sum(0)
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            *nones,
        )


def _kept_logits_backward(
    ctx: Any,
    kept: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    log_z: torch.Tensor,
    entropy: torch.Tensor,
    g_logprob: torch.Tensor | None,
    g_entropy: torch.Tensor | None,
    needs: tuple[bool, bool, bool],
) -> tuple[torch.Tensor | None, ...]:
    """The backward of :class:`_ChunkedStats` from kept logits. Their gradient is written over them
    a chunk at a time; then each of the hidden states', weight's and bias' gradients is one product
    over the whole micro-batch. (Per chunk, the weight gradient's ``[V, H]`` fp32 accumulator was
    read and written once a chunk, and the skinny products ran below the GEMMs' best rate.)
    The kept buffer is consumed: its version is bumped, so a second backward through the same graph
    (``retain_graph=True``) raises instead of reading gradients as logits."""
    grad_in_place = _kernels["grad_in_place"]
    for start in range(0, kept.shape[0], ctx.chunk):
        rows = slice(start, start + ctx.chunk)
        grad_in_place(
            kept[rows],
            labels[rows],
            log_z[rows],
            entropy[rows],
            None if g_logprob is None else g_logprob[rows],
            None if g_entropy is None else g_entropy[rows],
            ctx.temperature,
        )
    torch.autograd.graph.increment_version(kept)  # a kernel's write through a pointer bumps nothing
    need_h, need_w, need_b = needs
    grad_h = torch.matmul(kept, weight).to(hidden.dtype) if need_h else None
    grad_w = torch.matmul(kept.t(), hidden).to(weight.dtype) if need_w else None
    grad_b = kept.sum(0, dtype=torch.float32).to(bias.dtype) if need_b else None
    return grad_h, grad_w, grad_b


def chunked_next_token_stats(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk: int | None = None,
    keep_logits: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log p(labels[t] | hidden[t] @ W^T / temperature)`` and optionally the entropy at each position.

    ``hidden`` ``[N, H]``, ``weight`` ``[V, H]`` (the LM head), ``labels`` ``[N]``; results are fp32
    ``[N]``. Equal to :func:`areal_tasks.kernels.logprobs.next_token_stats` of the full logits,
    gradients included (the entropy's only with ``entropy_grad``; it is detached otherwise), with
    ``chunk`` positions' logits alive at a time (default :func:`default_chunk_size`).
    ``keep_logits``: with gradients enabled, compute the logits (``N x V`` in the compute dtype) with
    one matmul and keep them until the backward instead of recomputing them there: one matmul of
    ``2 N V H`` FLOPs less, for that memory; the backward overwrites them with their gradient, so
    the graph can be run backward once only.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise EngineError(
            f"chunked LM head expects hidden [N, H] and weight [V, H], got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if labels.shape != hidden.shape[:1]:
        raise EngineError(f"chunked LM head: {labels.shape[0]} labels for {hidden.shape[0]} positions")
    if temperature <= 0:
        raise EngineError(f"temperature must be > 0, got {temperature}")
    chunk = default_chunk_size(weight.shape[0]) if chunk is None else int(chunk)
    if chunk < 1:
        raise EngineError(f"chunk must be >= 1, got {chunk}")
    logprob, entropy = _ChunkedStats.apply(
        hidden,
        weight,
        bias,
        labels.to(torch.long),
        float(temperature),
        chunk,
        bool(with_entropy),
        bool(entropy_grad),
        bool(keep_logits) and _backward_expected(hidden, weight, bias),
    )
    return logprob, (entropy if with_entropy else None)


def _backward_expected(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd will record the head's call (gradients on, some input requiring them)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


@dataclass
class _Request:
    labels: torch.Tensor
    temperature: float
    with_entropy: bool
    entropy_grad: bool


class ChunkedLMHead(torch.nn.Module):
    """An LM head ``nn.Linear`` replacement sharing its parameters; scores labels while
    :meth:`scoring` is active (see the module docstring)."""

    def __init__(self, linear: torch.nn.Linear, chunk: int | None = None, keep_logits: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        if linear.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = linear.bias
        self.chunk = default_chunk_size(self.out_features) if chunk is None else int(chunk)
        #: keep the logits for the backward instead of recomputing them (``chunked_next_token_stats``)
        self.keep_logits = keep_logits
        self._request: _Request | None = None

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, chunk={self.chunk}, "
            f"keep_logits={self.keep_logits}"
        )

    @contextlib.contextmanager
    def scoring(
        self, labels: torch.Tensor, *, temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False
    ) -> Iterator[None]:
        """Within the block, the next forward returns fp32 ``[..., 2]`` (log-prob of ``labels``,
        entropy) or ``[..., 1]`` (log-prob) instead of logits; ``labels`` has one entry per position."""
        if self._request is not None:
            raise EngineError("ChunkedLMHead.scoring is already active (nested scoring is not supported)")
        self._request = _Request(labels, temperature, with_entropy, entropy_grad)
        try:
            yield
        finally:
            self._request = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        request = self._request
        if request is None:
            return torch.nn.functional.linear(hidden, self.weight, self.bias)
        self._request = None  # one forward per request
        flat = hidden.reshape(-1, hidden.shape[-1])
        logprob, entropy = chunked_next_token_stats(
            flat,
            self.weight,
            request.labels.reshape(-1),
            bias=self.bias,
            temperature=request.temperature,
            with_entropy=request.with_entropy,
            entropy_grad=request.entropy_grad,
            chunk=self.chunk,
            keep_logits=self.keep_logits,
        )
        shape = hidden.shape[:-1]
        parts = [logprob.view(shape)] + ([] if entropy is None else [entropy.view(shape)])
        return torch.stack(parts, dim=-1)  # a fresh tensor, not a view: FSDP hooks the root's outputs


def chunked_head_unsupported_reason(model: torch.nn.Module, lora_targets: Any = None) -> str | None:
    """Why :func:`install_chunked_head` would not apply to ``model`` (None when it would)."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    if family not in PLAIN_HEAD_FAMILIES:
        return f"model_type {family!r} is not one of {', '.join(PLAIN_HEAD_FAMILIES)} (logits may be post-processed)"
    head = getattr(model, "lm_head", None)
    if isinstance(head, ChunkedLMHead):
        return None
    if type(head) is not torch.nn.Linear:
        return f"lm_head is {type(head).__name__}, not nn.Linear"
    if lora_targets is not None:
        names = [lora_targets] if isinstance(lora_targets, str) else list(lora_targets)
        if any("lm_head" in str(name) for name in names):
            return "LoRA targets the LM head"
    return None


def install_chunked_head(
    model: torch.nn.Module, *, lora_targets: Any = None, chunk: int | None = None
) -> ChunkedLMHead | None:
    """Swap ``model.lm_head`` for a :class:`ChunkedLMHead` (before LoRA/TP/FSDP wrapping); returns it,
    or None (with the reason logged) when the model does not qualify."""
    reason = chunked_head_unsupported_reason(model, lora_targets)
    if reason is not None:
        logger.info("chunked LM head not used: %s; the full logits are computed", reason)
        return None
    if isinstance(model.lm_head, ChunkedLMHead):
        return model.lm_head
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    head = ChunkedLMHead(model.lm_head, chunk=chunk)
    model.lm_head = head
    if tied and head.weight is not model.get_input_embeddings().weight:
        raise EngineError("installing the chunked LM head broke the tie with the input embeddings")
    return head
