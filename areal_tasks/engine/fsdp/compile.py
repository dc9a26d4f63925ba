"""``torch.compile`` for the train engine: fuse the element-wise work around the matmuls.

At Qwen2.5-0.5B's width (hidden 896) a training step's matmuls take less device time than the
element-wise kernels around them (RMSNorm's fp32 round trip, SiLU x up, the LM head's per-chunk
soft-max work), and the host spends its time launching thousands of small kernels. Compiling those
pieces fuses each into one or two kernels:

* in every decoder block, each child module except the attention (the MLP and the norms), and the
  decoder's final norm (:func:`areal_tasks.models.compile.compile_pointwise_modules`: in place, so
  parameter names, ties, FSDP2's parameter swaps and checkpoints are untouched; dynamic shapes,
  as packed micro-batches change length every step);
* the chunked LM head's element-wise functions (:func:`~areal_tasks.engine.fsdp.lm_head.compile_chunk_kernels`).

The attention stays eager: it reads host-side sequence bounds from the model kwargs (varlen flash
attention, Ulysses), which a compiled graph would specialise on and recompile for every batch.

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


def compile_model(model: torch.nn.Module, blocks: list[torch.nn.Module], *, chunked_head: bool) -> list[str]:
    """Compile ``blocks``' non-attention children, the final norm and the LM-head chunk kernels in
    place; returns what was compiled."""
    from areal_tasks.engine.fsdp.lm_head import compile_chunk_kernels
    from areal_tasks.models.compile import compile_pointwise_modules

    compiled = compile_pointwise_modules(model, blocks)
    if chunked_head:
        compile_chunk_kernels()
        compiled.append("lm_head chunks")
    return compiled
