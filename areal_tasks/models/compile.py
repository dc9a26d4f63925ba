"""``torch.compile`` of a decoder's element-wise modules, shared by the train engine and the server.

In every decoder block of an HF causal LM, each child module except the attention (the MLP and the
norms), and the decoder's final norm, are compiled in place with ``nn.Module.compile`` (parameter
names, ties and checkpoints are untouched). Inductor fuses RMSNorm's fp32 round trip and SiLU x up
into one or two kernels each. ``dynamic=True``: packed training micro-batches and decode batches
change size every call, and one compiled graph serves them all.

The attention modules stay eager: their kernels read host-side sequence bounds (training) or run
inside the server's own cache plumbing, which a compiled graph would specialise on. Where the
attention can be traced, whole blocks compile instead (:func:`compile_block_forward`: the train
engine's ``compile_scope="blocks"``, the server's captured decode steps in
``inference/server/block_compile.py``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


def is_attention(module: torch.nn.Module) -> bool:
    """A block's attention module (``Qwen2Attention``, ``LlamaAttention``...), left eager."""
    return "attention" in type(module).__name__.lower()


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks (the first non-empty ``ModuleList`` named ``...layers``, peft wrapping
    included), or [] when none (the engine's ``find_decoder_blocks`` raises then)."""
    import torch

    for name, module in model.named_modules():
        if name.endswith("layers") and isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return list(module)
    return []


def compile_pointwise_modules(model: torch.nn.Module, blocks: list[torch.nn.Module] | None = None) -> list[str]:
    """Compile ``blocks``' (default: :func:`decoder_blocks`) non-attention children and the final
    norm in place; returns their names relative to ``model``."""
    blocks = decoder_blocks(model) if blocks is None else blocks
    names = {id(module): name for name, module in model.named_modules()}
    targets = [child for block in blocks for child in block.children() if not is_attention(child)]
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    final_norm = getattr(decoder, "norm", None)
    if final_norm is not None:
        targets.append(final_norm)
    for module in targets:
        module.compile(dynamic=True, options=length_agnostic_options())
    compiled = [names.get(id(module), type(module).__name__) for module in targets]
    logger.info("torch.compile: %d modules (%s, ...)", len(compiled), ", ".join(compiled[:3]))
    return compiled


def compile_block_group(blocks: list[torch.nn.Module]) -> Callable[..., Any]:
    """One compiled forward that runs ``blocks`` in turn (each with the same keyword arguments) as
    a single graph; groups of the same size share their graphs, as single blocks do (see
    :func:`compile_block_forward`). Each block must return its hidden states as a tensor
    (transformers 5 decoder layers do)."""
    import torch

    forwards = tuple(block.forward for block in blocks)

    def run_group(hidden_states: torch.Tensor, *args: Any, _forwards: tuple = forwards, **kwargs: Any) -> Any:
        for forward in _forwards:
            hidden_states = forward(hidden_states, *args, **kwargs)
            if not isinstance(hidden_states, torch.Tensor):
                raise TypeError(
                    f"a decoder block returned {type(hidden_states).__name__}, not its hidden states "
                    "as a tensor; compile one block per graph for this model"
                )
        return hidden_states

    return _compile_with_symbolic_module_ints(run_group)


def pass_through(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
    """The forward of a block whose work the first block of its group does: its input, unchanged."""
    return hidden_states


def compile_block_forward(block: torch.nn.Module) -> Callable[..., Any]:
    """``block.forward`` through ``torch.compile`` (dynamic shapes), called with the module's integer
    attributes (``layer_idx``) traced as symbols rather than constants
    (``allow_unspec_int_on_nn_module``): every block of a model then shares one set of graphs instead
    of recompiling block by block until Dynamo's recompile limit sends the later ones back to eager."""
    return _compile_with_symbolic_module_ints(block.forward)


def length_agnostic_options() -> dict[str, Any]:
    """Inductor options for graphs whose token count changes every call: mix-order reduction
    fusion (RMSNorm's backward reduces rows for the input gradient and columns for the weight
    gradient in one kernel) without its size check. That check guards the graph on the micro-batch's
    length (``T x hidden >= 5 Mi`` elements), so a short micro-batch after long ones recompiled the
    graphs, a step of many seconds in the middle of a training run (docs/benchmarks_history.md,
    "Train throughput", ninth session). Empty where this torch lacks the option."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config.triton, "mix_order_reduction_non_strict_mode"):
        return {"triton.mix_order_reduction_non_strict_mode": True}
    return {}


def _compile_with_symbolic_module_ints(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(fn, dynamic=True)``, called with ``allow_unspec_int_on_nn_module`` (see
    :func:`compile_block_forward`) and the rotary tables' last dimension (the head dimension)
    static. The attention makes its module's ``head_dim`` static from inside the graph
    (``kernels/attention.py``); symbolic, both turned every index of the rotary embedding into
    run-time 64-bit divisions."""
    import torch

    compiled = torch.compile(fn, dynamic=True, options=length_agnostic_options())

    def forward(*args: Any, **kwargs: Any) -> Any:
        for table in kwargs.get("position_embeddings") or ():  # rotary cos/sin: only their length varies
            if isinstance(table, torch.Tensor):
                torch._dynamo.mark_static(table, table.dim() - 1)
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):
            return compiled(*args, **kwargs)

    return forward


@functools.cache
def triton_on_cuda() -> bool:
    """Whether hand-written Triton kernels can run here: Triton imports and a CUDA device is present
    (False with the CPU build of torch, which ships no Triton)."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
