"""One GEMM for a block's query/key/value projections, and one for its MLP's gate and up projections.

At decode sizes a projection is a small GEMM (256 rows into 896 columns; the key and value ones
into 128) that costs a few microseconds mostly in launch and tail, and a decoder block runs five
such input projections on the same activations. :func:`fuse_input_projections` lays each group's
weights back to back in one tensor (and their biases) and turns the modules' own parameters into
views of it, so:

- a weight update, which copies into the parameters in place, updates the fused weight too, and
  captured CUDA graphs keep reading the same memory;
- every forward that does not opt in (prefill, eager decode, anything calling a module directly)
  runs each projection on its own view, exactly as before;
- inside :meth:`FusedGroup.active` the group's modules share one GEMM: the first of them to be
  called with an input runs the fused product and returns its slice, the others return theirs.

The compiled decode blocks (``block_compile.py``) opt in while their steps are captured. A group is
formed only from ``nn.Linear`` modules of one input size, dtype and device whose biases are all
present or all absent; models that already fuse (``qkv_proj``) or name their projections otherwise
are left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

#: projection groups fused per decoder block: attention inputs, then the MLP's gated inputs.
GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


class FusedGroup:
    """Linear modules over the same input whose weights live in one tensor (see the module doc)."""

    def __init__(self, modules: list[torch.nn.Linear]) -> None:
        self.modules = modules
        with torch.no_grad():
            self.weight = torch.cat([m.weight for m in modules])
            self.bias = torch.cat([m.bias for m in modules]) if modules[0].bias is not None else None
        self.bounds: list[tuple[int, int]] = []
        start = 0
        for module in modules:
            end = start + module.out_features
            self.bounds.append((start, end))
            module.weight.data = self.weight[start:end]
            if self.bias is not None:
                module.bias.data = self.bias[start:end]
            start = end
        self._input: torch.Tensor | None = None
        self._parts: list[torch.Tensor | None] = []

    def _part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        if self._input is not x or self._parts[index] is None:
            fused = F.linear(x, self.weight, self.bias)
            self._input = x
            self._parts = [fused[..., a:b] for a, b in self.bounds]
        part, self._parts[index] = self._parts[index], None
        if all(p is None for p in self._parts):
            self._input, self._parts = None, []  # hold no activations past the group's last call
        return part  # type: ignore[return-value]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside, the modules share the fused GEMM; their own forwards come back on exit."""
        for index, module in enumerate(self.modules):
            module.forward = lambda x, index=index: self._part(index, x)
        try:
            yield
        finally:
            for module in self.modules:
                module.__dict__.pop("forward", None)
            self._input, self._parts = None, []


def _fusible(modules: list[object]) -> bool:
    linears = [m for m in modules if isinstance(m, torch.nn.Linear)]
    if len(linears) != len(modules):
        return False
    first = linears[0]
    return all(
        m.in_features == first.in_features
        and m.weight.dtype == first.weight.dtype
        and m.weight.device == first.weight.device
        and (m.bias is None) == (first.bias is None)
        for m in linears
    )


def fuse_input_projections(blocks: list[torch.nn.Module]) -> list[FusedGroup]:
    """Fuse each block's q/k/v and gate/up projections where they qualify (module doc)."""
    groups = []
    for block in blocks:
        for parent_name, names in GROUPS:
            parent = getattr(block, parent_name, None)
            modules = [getattr(parent, name, None) for name in names]
            if parent is not None and _fusible(modules):
                groups.append(FusedGroup(modules))  # type: ignore[arg-type]
    return groups
