"""The serving attention: transformers' SDPA attention, with grouped-query decode that never copies keys.

A decode step has one query per sequence. With grouped-query attention (Qwen2.5-0.5B: 14 query
heads, 2 key/value heads) SDPA with a mask would otherwise need the keys and values repeated up to
the query heads, a 7x copy of the whole cache span every layer and step. Here the ``g`` query heads
that share a key/value head are laid along SDPA's query-length axis instead
(``[B, H, 1, D] -> [B, H_kv, g, D]``), so each key/value head is read once and the per-row mask
``[B, 1, 1, L]`` broadcasts over them. Everything else (prefill, masks with a head axis, models
without GQA) is transformers' own ``sdpa_attention_forward``, unchanged.

Forwards whose shapes vary from call to call (prefill, eager decode) run SDPA without its cuDNN
backend. cuDNN builds an execution plan for every new shape, a large fraction of a second each
(docs/benchmarks.md, "Inference throughput (H200)"); torch 2.11 picks it first on Hopper for masked
attention, so a prefill batch of a size the server had not seen stalled the engine for that long
(and a weight update waiting for the iteration with it). The static decode steps keep it
(:func:`static_shapes`): their shapes are fixed, and their warm-up runs plan them before the capture
(a plan built during a capture broke it).

On CUDA the one-query decode call (grouped or not) runs the Triton kernel of ``decode_kernel.py`` instead of SDPA
when the model runner turned it on for the model's attention layers (:func:`use_decode_kernel`,
``RunnerConfig.decode_attention``) and the inputs fit it.

Registered with transformers as ``attn_implementation="areal_serve"`` (no mask builder of its own:
the model runner prepares every mask, and transformers passes them through untouched).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from areal_tasks.inference.server.decode_kernel import decode_attention, kernel_fits

SERVE_ATTN = "areal_serve"
#: SDPA backends for forwards of varying shapes (see the module doc).
VARYING_SHAPE_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


#: attribute set on a model's attention layers whose grouped decode runs the Triton kernel.
DECODE_KERNEL_ATTR = "_areal_decode_kernel"

_STATIC_SHAPES: contextvars.ContextVar[bool] = contextvars.ContextVar("areal_static_shapes", default=False)


@contextlib.contextmanager
def static_shapes() -> Iterator[None]:
    """Forwards inside run with fixed shapes (the captured decode steps and their warm-up): SDPA
    may pick cuDNN."""
    token = _STATIC_SHAPES.set(True)
    try:
        yield
    finally:
        _STATIC_SHAPES.reset(token)


def sdpa_backends(query: torch.Tensor) -> contextlib.AbstractContextManager:
    """The SDPA backend choice for this call: every backend but cuDNN on a GPU, unless inside
    :func:`static_shapes` or traced by ``torch.compile`` (only the static decode steps compile
    attention, and a ``ContextVar`` read would break the graph); SDPA's own choice otherwise."""
    if query.is_cuda and not torch.compiler.is_compiling() and not _STATIC_SHAPES.get():
        return sdpa_kernel(VARYING_SHAPE_BACKENDS)
    return contextlib.nullcontext()


def serve_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``(attn_output [B, T, H, D], None)`` like transformers' SDPA attention (see the module doc)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    one_query = (
        q_len == 1
        and heads % kv_heads == 0
        and dropout == 0.0
        and (attention_mask is None or attention_mask.shape[1] == 1)
        and all(kwargs.get(name) is None for name in ("position_bias", "softcap", "s_aux"))
    )
    grouped_query = query.reshape(batch, kv_heads, heads // kv_heads, head_dim) if one_query else query
    if (
        one_query
        and getattr(module, DECODE_KERNEL_ATTR, False)
        and kernel_fits(grouped_query, key, value, attention_mask)
    ):
        scale = head_dim**-0.5 if scaling is None else scaling
        out = decode_attention(grouped_query, key, value, attention_mask, scale)
        return out.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous(), None
    if not one_query or heads == kv_heads:
        with sdpa_backends(query):
            return sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
            )
    with sdpa_backends(query):
        out = torch.nn.functional.scaled_dot_product_attention(
            grouped_query, key, value, attn_mask=attention_mask, scale=scaling, is_causal=False
        )
    return out.reshape(batch, heads, 1, head_dim).transpose(1, 2).contiguous(), None


def use_decode_kernel(model: torch.nn.Module) -> int:
    """Run the grouped decode attention of ``model``'s attention layers (the modules with a
    ``layer_idx`` and a ``scaling``, as transformers' are) through the Triton kernel; returns how
    many layers were switched."""
    layers = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "scaling")]
    for layer in layers:
        setattr(layer, DECODE_KERNEL_ATTR, True)
    return len(layers)


def register_serve_attention() -> str:
    """Register :func:`serve_attention_forward` with transformers (once); returns its name."""
    from areal_tasks.kernels.attention import register_attention

    return register_attention(SERVE_ATTN, serve_attention_forward)
