"""Causal attention over packed sequences (block-diagonal): the engine's varlen attention and the
attention under Ulysses sequence parallelism.

``packed_attention`` takes ``[1, H, T, D]`` query/key/value of several sequences laid end to end
(``cu_seqlens`` bounds them) and attends within each sequence only, with the first kernel that
applies:

* CUDA with flash-attn installed: ``flash_attn_varlen_func`` (one kernel, no mask);
* CUDA, fp16/bf16, no dropout: torch's own flash kernel through ``torch.nn.attention.varlen``
  (:func:`varlen_packed`; torch >= 2.10, no extra package);
* off CUDA: one causal SDPA call per sequence (``sum(L^2)`` work; a ``T x T`` mask over a
  micro-batch of many short sequences cost most of a CPU training step);
* otherwise (CUDA with fp32, dropout, or a torch without the varlen API): one SDPA call with a
  ``T x T`` block-diagonal causal mask.

Without sequence parallelism the engine registers :func:`varlen_attention_forward` with transformers
as ``attn_implementation="areal_varlen"`` (the default on CPU, and on CUDA when flash-attn is absent,
see ``build.py``): it reads the sequence bounds that ``forward.py`` passes through the model kwargs
(``cu_seq_lens_q``, ``max_length_q``, ``areal_seq_bounds``) and calls ``packed_attention``.
transformers' own ``sdpa`` would build the same ``T x T`` mask from the position ids, whose
block-mask SDPA dominated a training step on long micro-batches (figures: ``docs/benchmarks.md``).
The engine's attentions register no mask builder, so
transformers skips its mask preparation (and the packed-sequence check that reads a device value
back to the host) entirely.

The varlen API changed between torch releases (2.10: ``is_causal``; later: ``window_size``,
``scale``, ``enable_gqa``), so :func:`varlen_packed` inspects the signature once and adapts:
without ``scale`` the query is pre-scaled, without ``enable_gqa`` grouped key/value heads go to
torch's flash kernels through the engine's own custom op (``flash_gqa.py``: no repeated copies
of the key/value heads; a sliding window still repeats them), and without
``window_size`` sliding-window layers use the block mask.
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

BOUNDS_KWARG = "areal_seq_bounds"
VARLEN_ATTN = "areal_varlen"

#: largest head dimension the flash kernels take.
_MAX_FLASH_HEAD_DIM = 256

_registered: set[str] = set()


def block_causal_mask(cu_seqlens: torch.Tensor, total: int, sliding_window: int | None = None) -> torch.Tensor:
    """``[total, total]`` bool mask: query ``i`` sees key ``j`` iff same sequence and ``j <= i``
    (and ``i - j < sliding_window`` when set)."""
    import torch

    idx = torch.arange(total, device=cu_seqlens.device)
    seq = torch.searchsorted(cu_seqlens[1:].to(idx.dtype), idx, right=True)
    mask = (seq[:, None] == seq[None, :]) & (idx[None, :] <= idx[:, None])
    if sliding_window is not None:
        mask &= (idx[:, None] - idx[None, :]) < sliding_window
    return mask


def repeat_heads(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Repeat every head ``n_rep`` times along dim 1 (GQA key/value heads up to the query heads)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


# Probed once, in eager code, and memoised in module globals rather than with ``functools.cache``:
# these run inside compiled decoder blocks too, where Dynamo reads a global as a constant but would
# trace a cached function's body (``importlib``, ``inspect``) again and break the graph there.
_UNPROBED: Any = object()
_flash_attn: Any = _UNPROBED
_varlen: Any = _UNPROBED
_gqa_op: Any = _UNPROBED


def flash_attn_installed() -> bool:
    """Whether the flash-attn package is importable (looked up once)."""
    global _flash_attn
    if _flash_attn is _UNPROBED:
        _flash_attn = importlib.util.find_spec("flash_attn") is not None
    return _flash_attn


def _probe_varlen_api() -> tuple[Callable[..., Any], frozenset[str]] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    try:
        params = frozenset(inspect.signature(varlen_attn).parameters)
    except (TypeError, ValueError):
        return None
    if not params & {"window_size", "is_causal"}:
        logger.warning("torch.nn.attention.varlen.varlen_attn takes neither window_size nor is_causal; not used")
        return None
    return varlen_attn, params


def _varlen_api() -> tuple[Callable[..., Any], frozenset[str]] | None:
    """torch's ``varlen_attn`` and the names of its parameters, or None when this torch lacks it."""
    global _varlen
    if _varlen is _UNPROBED:
        _varlen = _probe_varlen_api()
    return _varlen


def _native_gqa() -> Callable[..., Any]:
    """:func:`flash_gqa.flash_varlen_gqa` (imported once: importing it registers its custom ops)."""
    global _gqa_op
    if _gqa_op is _UNPROBED:
        from areal_tasks.kernels.flash_gqa import flash_varlen_gqa

        _gqa_op = flash_varlen_gqa
    return _gqa_op


def probe_kernels() -> None:
    """Look up the optional attention kernels now, in eager code (before blocks are compiled)."""
    flash_attn_installed()
    if _varlen_api() is not None:
        _native_gqa()


def varlen_api_available() -> bool:
    """Whether this torch ships ``torch.nn.attention.varlen.varlen_attn`` in a form the engine can call."""
    return _varlen_api() is not None


def varlen_supported(q: torch.Tensor, dropout: float = 0.0, sliding_window: int | None = None) -> bool:
    """Whether :func:`varlen_packed` can run on ``q`` (CUDA, fp16/bf16, no dropout, head dim <= 256,
    and a sliding window only if this torch's API takes ``window_size``)."""
    import torch

    api = _varlen_api()
    if api is None or not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16) or dropout > 0.0:
        return False
    if q.shape[-1] > _MAX_FLASH_HEAD_DIM:
        return False
    return sliding_window is None or "window_size" in api[1]


def varlen_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_len: int,
    *,
    scaling: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal varlen attention of token-major ``[T, H, D]`` tensors (``k``/``v``: ``[T, Hkv, D]``)
    with torch's flash kernel; returns ``[T, H, D]``. Check :func:`varlen_supported` first."""
    import torch

    api = _varlen_api()
    if api is None:
        raise EngineError("torch.nn.attention.varlen is not available in this torch (needs torch >= 2.10)")
    fn, params = api
    head_dim = q.shape[-1]
    cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.to(torch.int32)
    grouped = k.shape[1] != q.shape[1]
    if grouped and q.shape[1] % k.shape[1] != 0:
        raise EngineError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads")
    if grouped and "enable_gqa" not in params and sliding_window is None:
        # torch's flash kernels over the grouped heads as they are, through the engine's own op
        return _native_gqa()(q, k, v, cu, max_len, head_dim**-0.5 if scaling is None else scaling)
    kwargs: dict[str, Any] = {}
    if "window_size" in params:  # (-1, 0): causal; (w - 1, 0): causal within the last w keys
        kwargs["window_size"] = (-1, 0) if sliding_window is None else (int(sliding_window) - 1, 0)
        if "is_causal" in params and sliding_window is None:
            kwargs["is_causal"] = True
    else:
        if sliding_window is not None:
            raise EngineError("this torch's varlen_attn has no window_size: sliding-window layers need the block mask")
        kwargs["is_causal"] = True
    default_scale = head_dim**-0.5
    # plain arithmetic, not math.isclose: inside a compiled block head_dim is symbolic
    if scaling is not None and abs(scaling - default_scale) > 1e-6 * default_scale:
        if "scale" in params:
            kwargs["scale"] = float(scaling)
        else:  # the kernel applies 1/sqrt(D): fold the rest into the query
            q = q * (scaling * math.sqrt(head_dim))
    if grouped:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:  # a sliding window on a torch without enable_gqa: repeat the key/value heads
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    # max_len as given: inside a compiled block it is a symbolic int, and int() would specialise on it
    return fn(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, max_len, max_len, **kwargs)


def _flash_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_len: int,
    scaling: float | None,
    dropout: float,
    sliding_window: int | None,
) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
    out = flash_attn_varlen_func(
        q[0].transpose(0, 1),
        k[0].transpose(0, 1),
        v[0].transpose(0, 1),
        cu,
        cu,
        max_len,
        max_len,
        dropout_p=dropout,
        softmax_scale=scaling,
        causal=True,
        window_size=window,
    )
    return out.transpose(0, 1).unsqueeze(0)


def _max_len(cu_seqlens: torch.Tensor, bounds: tuple[int, ...] | None, max_len: int | None) -> int:
    if max_len is not None:
        return max_len  # not int(): a compiled block's symbolic int stays symbolic
    if bounds is not None:
        return max(b - a for a, b in itertools.pairwise(bounds))
    return int((cu_seqlens[1:] - cu_seqlens[:-1]).max())  # reads a device value back: pass bounds instead


def packed_kernel(q: torch.Tensor, dropout: float = 0.0, sliding_window: int | None = None) -> str:
    """Which kernel :func:`packed_attention` uses for ``q``: ``flash_attn``, ``varlen``,
    ``per_sequence`` (off CUDA) or ``block_mask``."""
    if q.is_cuda and flash_attn_installed():
        return "flash_attn"
    if varlen_supported(q, dropout, sliding_window):
        return "varlen"
    if not q.is_cuda:
        return "per_sequence"
    return "block_mask"


def _per_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bounds: tuple[int, ...],
    scaling: float | None,
    dropout: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """One causal SDPA call per packed sequence, concatenated: ``sum(L^2)`` work instead of ``T^2``."""
    import torch

    rep = q.shape[1] // k.shape[1]
    outs = []
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        window = None if sliding_window is None else _window_mask(end - start, sliding_window, q.device)
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                q[:, :, start:end],
                repeat_heads(k[:, :, start:end], rep),
                repeat_heads(v[:, :, start:end], rep),
                attn_mask=window,
                dropout_p=dropout,
                scale=scaling,
                is_causal=window is None,
            )
        )
    return torch.cat(outs, dim=2)


def packed_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    bounds: tuple[int, ...] | None = None,
    max_len: int | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Block-diagonal causal attention of ``[1, H, T, D]`` tensors (``k``/``v`` may have fewer heads).

    ``bounds`` (the host copy of ``cu_seqlens``) or ``max_len`` spare a device-to-host read.
    """
    import torch

    if q.shape[0] != 1:
        raise EngineError(f"packed attention expects one packed row, got batch size {q.shape[0]}")
    kernel = packed_kernel(q, dropout, sliding_window)
    if kernel == "flash_attn":
        return _flash_varlen(
            q, k, v, cu_seqlens.to(torch.int32), _max_len(cu_seqlens, bounds, max_len), scaling, dropout, sliding_window
        )
    if kernel == "varlen":
        out = varlen_packed(
            q[0].transpose(0, 1),
            k[0].transpose(0, 1),
            v[0].transpose(0, 1),
            cu_seqlens,
            _max_len(cu_seqlens, bounds, max_len),
            scaling=scaling,
            sliding_window=sliding_window,
        )
        return out.transpose(0, 1).unsqueeze(0)
    # CPU: no device read; inside a compiled graph without the host bounds, the block mask (a host
    # read there would break the graph)
    if kernel == "per_sequence" and (bounds is not None or not torch.compiler.is_compiling()):
        host = bounds if bounds is not None else tuple(int(b) for b in cu_seqlens.tolist())
        if host[0] == 0 and host[-1] == q.shape[2]:
            return _per_sequence(q, k, v, host, scaling, dropout, sliding_window)
    rep = q.shape[1] // k.shape[1]
    k, v = repeat_heads(k, rep), repeat_heads(v, rep)
    mask = block_causal_mask(cu_seqlens, q.shape[2], sliding_window)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface of ``areal_varlen``: ``[B, H, S, D]`` in, ``[B, S, H, D]`` out.

    With ``cu_seq_lens_q`` in the kwargs (the engine's packed micro-batches, one row) it runs
    :func:`packed_attention`. Without it (a plain call of the model) every row is one causal
    sequence; a padding mask is not supported then (the engine never passes one).
    """
    import torch

    _static_head_dim(module)
    drop = dropout if module.training else 0.0
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        if attention_mask is not None:
            raise EngineError(
                f"{VARLEN_ATTN} attention takes packed sequences (cu_seq_lens_q), not an attention "
                "mask; use attn_implementation='sdpa' for padded batches"
            )
        rep = query.shape[1] // key.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(
            query,
            repeat_heads(key, rep),
            repeat_heads(value, rep),
            dropout_p=drop,
            scale=scaling,
            is_causal=sliding_window is None,
            attn_mask=None if sliding_window is None else _window_mask(query.shape[2], sliding_window, query.device),
        )
        return out.transpose(1, 2), None
    out = packed_attention(
        query,
        key,
        value,
        cu,
        bounds=kwargs.get(BOUNDS_KWARG),
        max_len=kwargs.get("max_length_q"),
        scaling=scaling,
        dropout=drop,
        sliding_window=sliding_window,
    )
    return out.transpose(1, 2), None


def _static_head_dim(module: torch.nn.Module) -> None:
    """Inside a compiled graph, make the attention module's ``head_dim`` a constant (a no-op in
    eager code, or for a module without one).

    Whole blocks compile with their modules' integer attributes symbolic (``models/compile.py``: one
    graph for every block, whatever its ``layer_idx``), which makes ``head_dim`` symbolic too, and
    with it every index of the rotary embedding and of the head reshapes around the attention:
    Inductor then divides by run-time 64-bit values in each element's index, which made those
    kernels several times slower than their memory traffic allows (docs/benchmarks_history.md,
    "Train throughput", ninth session). Forcing the symbol static guards on its value, and the guard
    replaces the symbol in the whole graph (not so a guard on a derived size such as
    ``query.shape[-1]``, which is ``896 // (896 // s)``)."""
    import torch

    head_dim = getattr(module, "head_dim", None)
    if head_dim is not None and torch.compiler.is_compiling():
        torch._dynamo.comptime.comptime.force_static(head_dim)


def _window_mask(n: int, window: int, device: torch.device) -> torch.Tensor:
    import torch

    idx = torch.arange(n, device=device)
    diff = idx[:, None] - idx[None, :]
    return (diff >= 0) & (diff < window)


def register_attention(name: str, forward: Any) -> str:
    """Register an attention forward with transformers under ``name`` (idempotent).

    No mask builder is registered: transformers then passes ``attention_mask`` through untouched
    (``None`` for the engine's packed micro-batches) and skips its mask preparation, whose
    packed-sequence check would read a device value back to the host on every forward.
    """
    from transformers import AttentionInterface

    if name not in _registered:
        AttentionInterface.register(name, forward)
        _registered.add(name)
    return name


def register_varlen_attention() -> str:
    """Register :func:`varlen_attention_forward` as ``areal_varlen``; returns the name."""
    return register_attention(VARLEN_ATTN, varlen_attention_forward)
