"""``torch.compile`` for the train engine: fewer, fused kernels and less host work per step.

At Qwen2.5-0.5B's width (hidden 896) a training step's matmuls take less device time than the
element-wise kernels around them (RMSNorm's fp32 round trip, SiLU x up, the rotary embedding, the
LM head's per-chunk soft-max work), and the host spends its time launching thousands of small
kernels. ``EngineConfig.compile_scope`` picks what is compiled:

* ``blocks``: each whole decoder block's forward (:func:`compile_whole_blocks`): the q/k/v
  reshapes, the rotary embedding, the attention call, the residual adds, the norms and the MLP
  run as one compiled graph a block (and one backward graph), so the autograd engine and Python see
  24 nodes instead of a few hundred. The attention stays one opaque kernel inside it (torch's
  varlen flash custom op); its sequence bounds reach it as a tensor and a symbolic ``max_len``, so
  a new micro-batch length does not recompile. The forward is replaced on the module instance, so
  FSDP2's hooks on the block stay eager, and parameter names, ties and checkpoints are untouched.
  ``EngineConfig.compile_blocks_per_graph`` > 1 runs that many consecutive blocks as one graph
  (the first block's forward runs the group, the others pass their input through): each compiled
  call has a host cost of its own, which at this width kept the GPU idle. It needs the model as
  one FSDP unit, and compiling takes about that many times as long (a whole 24-block decoder as
  one graph did not finish compiling within a benchmark run: docs/benchmarks_history.md, "Train
  throughput", sixth session);
* ``pointwise``: only the non-attention children of each block (the MLP and the norms;
  :func:`areal_tasks.models.compile.compile_pointwise_modules`), for attentions that cannot be
  traced (Ulysses' all-to-all, the CPU per-sequence path that reads the host bounds);
* either way, the decoder's final norm and the chunked LM head's element-wise functions
  (:func:`~areal_tasks.kernels.lm_head.compile_chunk_kernels`).

All with dynamic shapes: packed micro-batches change length every step. Two things keep one graph
serving every length and its index arithmetic free of run-time divisions: the head dimension is
made static (``models/compile.py``, ``attention.py``), and mix-order reduction fusion runs without
its size check (:func:`~areal_tasks.models.compile.length_agnostic_options`), which otherwise
guarded the graphs on the micro-batch length and recompiled them for a short one.

``EngineConfig.compile``: ``auto`` compiles on CUDA only (on CPU, Inductor's C++ compile costs more
than it saves on test-sized models), ``on`` always, ``off`` never. Tensor parallelism and LoRA keep
the eager path (their DTensor and peft wrappers are not compiled here).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

    from areal_tasks.kernels.lm_head import ChunkedLMHead

logger = logging.getLogger(__name__)


def should_compile(setting: str, device: torch.device, *, tp: int, lora: bool) -> tuple[bool, str]:
    """Whether to compile, and why (for the log and ``engine.kernels``)."""
    if setting not in ("auto", "on", "off"):
        raise EngineError(f"compile must be auto, on or off, got {setting!r}")
    if setting == "off":
        return False, "compile=off"
    if tp > 1:
        return False, "tensor parallelism (tp > 1) runs eager"
    if lora:
        return False, "LoRA runs eager"
    if setting == "auto" and device.type != "cuda":
        return False, "compile=auto compiles on CUDA only"
    return True, f"compile={setting}"


def resolve_compile_scope(setting: str, *, attn_implementation: str, sp: int, device_type: str) -> str:
    """``blocks`` or ``pointwise`` for ``EngineConfig.compile_scope`` (see the module docstring)."""
    from areal_tasks.kernels.attention import VARLEN_ATTN

    if setting not in ("auto", "blocks", "pointwise"):
        raise EngineError(f"compile_scope must be auto, blocks or pointwise, got {setting!r}")
    if setting == "pointwise":
        return "pointwise"
    if sp > 1:
        if setting == "blocks":
            raise EngineError(
                "compile_scope=blocks needs sp=1: the Ulysses attention's all-to-all runs eager; "
                "set compile_scope to pointwise or auto"
            )
        return "pointwise"
    # the engine's varlen attention traces on CUDA; on CPU it runs per sequence from the host bounds
    if setting == "blocks" or (attn_implementation == VARLEN_ATTN and device_type == "cuda"):
        return "blocks"
    return "pointwise"


#: ``compile_blocks_per_graph=auto``: at most this many blocks a graph. On the 0.5B shape (24
#: blocks) 8 ran faster than 4, and a whole 24-block decoder as one graph did not finish compiling
#: within a benchmark run (docs/benchmarks_history.md, "Train throughput", sixth and tenth
#: sessions).
AUTO_BLOCKS_PER_GRAPH = 8


def blocks_per_graph(
    per_graph: int | str, *, scope: str, fsdp_wrap: str, layer_types: list[str] | None, num_blocks: int
) -> int:
    """The blocks a compiled graph runs (``EngineConfig.compile_blocks_per_graph``): ``per_graph``
    where whole blocks are compiled (``scope``), else 1 (nothing to group: logged). Raises
    EngineError when the blocks cannot share a graph. ``auto``: the largest divisor of
    ``num_blocks`` up to :data:`AUTO_BLOCKS_PER_GRAPH` where blocks can share a graph, else 1."""
    if per_graph == "auto":
        mixed = layer_types is not None and len(set(layer_types)) > 1
        if scope != "blocks" or fsdp_wrap == "block" or mixed or num_blocks < 1:
            return 1
        chosen = max(d for d in range(1, min(AUTO_BLOCKS_PER_GRAPH, num_blocks) + 1) if num_blocks % d == 0)
        logger.info("compile_blocks_per_graph=auto: %d of the %d decoder blocks a compiled graph", chosen, num_blocks)
        return chosen
    if isinstance(per_graph, bool) or not isinstance(per_graph, int) or per_graph < 1:
        raise EngineError(f"compile_blocks_per_graph must be auto or an integer >= 1, got {per_graph!r}")
    if per_graph == 1:
        return 1
    if scope != "blocks":
        logger.info(
            "compile_blocks_per_graph=%d has no effect: %s",
            per_graph,
            f"compile_scope resolved to {scope}" if scope else "nothing is compiled",
        )
        return 1
    if fsdp_wrap == "block":
        raise EngineError(
            f"compile_blocks_per_graph={per_graph} runs several blocks in one graph, which needs the "
            "model as one FSDP unit or no FSDP (fsdp_wrap=root or none; it resolved to block): "
            "per-block units gather each block's parameters in hooks around it; set "
            "compile_blocks_per_graph=1"
        )
    if layer_types is not None and len(set(layer_types)) > 1:
        raise EngineError(
            f"compile_blocks_per_graph={per_graph}: this model mixes layer types "
            f"({', '.join(sorted(set(layer_types)))}), whose blocks take different attention masks; "
            "set compile_blocks_per_graph=1"
        )
    return per_graph


def compile_whole_blocks(model: torch.nn.Module, blocks: list[torch.nn.Module], per_graph: int = 1) -> list[str]:
    """Replace each block's ``forward`` with a compiled one (on the instance: FSDP2's hooks, which
    run around ``forward``, stay eager) and compile the final norm; returns their names.

    With ``per_graph > 1`` the first block of every ``per_graph`` consecutive ones runs them all as
    one graph and the others pass their input through. That needs the model as one FSDP unit:
    take ``per_graph`` from :func:`blocks_per_graph`, which refuses the cases that cannot work."""
    from areal_tasks.kernels.attention import probe_kernels
    from areal_tasks.models.compile import (
        compile_block_forward,
        compile_block_group,
        length_agnostic_options,
        pass_through,
    )

    probe_kernels()  # in eager code: the compiled attention reads the result as a constant
    names = {id(module): name for name, module in model.named_modules()}
    for start in range(0, len(blocks), per_graph):
        group = blocks[start : start + per_graph]
        if per_graph == 1:
            group[0].forward = compile_block_forward(group[0])
            continue
        group[0].forward = compile_block_group(group)
        for block in group[1:]:
            block.forward = pass_through
    compiled = [names.get(id(block), type(block).__name__) for block in blocks]
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    final_norm = getattr(decoder, "norm", None)
    if final_norm is not None:
        final_norm.compile(dynamic=True, options=length_agnostic_options())
        compiled.append(names.get(id(final_norm), "norm"))
    logger.info("torch.compile: %d whole decoder blocks (%d a graph) and the final norm", len(blocks), per_graph)
    return compiled


def compile_model(
    model: torch.nn.Module,
    blocks: list[torch.nn.Module],
    *,
    chunked_head: ChunkedLMHead | None,
    scope: str = "pointwise",
    blocks_per_graph: int = 1,
) -> list[str]:
    """Compile ``blocks`` (whole, or their non-attention children: ``scope``), the final norm and
    the LM-head chunk kernels in place (the head then scores larger chunks:
    :data:`~areal_tasks.kernels.lm_head.COMPILED_CHUNK_ELEMENTS`); returns what was compiled."""
    from areal_tasks.kernels.lm_head import COMPILED_CHUNK_ELEMENTS, compile_chunk_kernels, default_chunk_size
    from areal_tasks.models.compile import compile_pointwise_modules

    if scope == "blocks":
        compiled = compile_whole_blocks(model, blocks, blocks_per_graph)
    elif scope == "pointwise":
        compiled = compile_pointwise_modules(model, blocks)
    else:
        raise EngineError(f"compile scope must be blocks or pointwise, got {scope!r}")
    if chunked_head is not None:
        compile_chunk_kernels()
        chunked_head.chunk = default_chunk_size(chunked_head.out_features, COMPILED_CHUNK_ELEMENTS)
        compiled.append(f"lm_head chunks of {chunked_head.chunk}")
    return compiled
