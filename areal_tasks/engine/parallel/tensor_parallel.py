"""DTensor tensor-parallel plans for the llama-style families (llama, qwen2, qwen3, mistral).

Per decoder block (Megatron style): q/k/v and gate/up projections are column-parallel (each TP rank
computes a slice of heads / of the intermediate features), o and down projections are row-parallel
(their partial outputs are all-reduced). Attention reshapes with ``-1`` heads, so every rank runs
attention on its own heads unchanged. Embeddings, norms and the LM head stay replicated (they may be
tied, and FSDP shards them anyway).

Qwen3's per-head ``q_norm``/``k_norm`` run on the local heads only, so each TP rank holds a partial
gradient for their (replicated) weights: :meth:`TensorParallel.sync_partial_grads` all-reduces those
over the TP group after backward (FSDP's reduce-scatter over dp is linear, so the order is free).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

logger = logging.getLogger(__name__)

SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

#: per-block modules and their style; q_norm/k_norm are only present in qwen3.
_BLOCK_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}
_PARTIAL_GRAD_MODULES = ("self_attn.q_norm", "self_attn.k_norm")


def check_tp_compatible(config: object, tp: int) -> None:
    """Raise :class:`EngineError` unless the model family has a plan and its sizes divide by ``tp``."""
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise EngineError(
            f"tensor parallelism has plans for {', '.join(SUPPORTED_FAMILIES)}; model_type {family!r} has none "
            "(use tp=1 and scale with dp/sp instead)"
        )
    sizes = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
    }
    bad = {k: v for k, v in sizes.items() if v % tp != 0}
    if bad:
        raise EngineError(f"tp={tp} must divide {bad} of the {family} model")


class TensorParallel:
    """Applies the plan to a causal LM (or token-classification critic) over ``tp_mesh``."""

    def __init__(self, tp_mesh: DeviceMesh) -> None:
        self.tp_mesh = tp_mesh
        # modules, not parameters: fully_shard later replaces the parameter objects
        self.partial_grad_modules: list[torch.nn.Module] = []

    def apply(self, model: torch.nn.Module) -> None:
        """Parallelize every decoder block of ``model`` in place (before FSDP wrapping)."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        check_tp_compatible(model.config, self.tp_mesh.size())
        blocks = find_decoder_blocks(model)
        styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
        for block in blocks:
            plan = {}
            for name, style in _BLOCK_PLAN.items():
                kind = type(block.get_submodule(name)).__name__
                if kind != "Linear":
                    raise EngineError(
                        f"tensor parallelism expects {name} to be nn.Linear, got {kind} "
                        "(LoRA with tp > 1 is not supported)"
                    )
                plan[name] = styles[style]()
            parallelize_module(block, self.tp_mesh, plan)
            for name in _PARTIAL_GRAD_MODULES:
                try:
                    module = block.get_submodule(name)
                except AttributeError:
                    continue
                self.partial_grad_modules.append(module)
        logger.info("tensor parallel over %d ranks: %d blocks", self.tp_mesh.size(), len(blocks))

    def sync_partial_grads(self) -> None:
        """All-reduce (sum) over TP the gradients of weights applied to local heads only."""
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        group = self.tp_mesh.get_group()
        with torch.no_grad():
            for module in self.partial_grad_modules:
                for p in module.parameters():
                    if p.grad is not None:
                        grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                        dist.all_reduce(grad, group=group)


def find_decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks (``...layers.N``) of an HF llama-style model, possibly wrapped by peft."""
    from areal_tasks.models.compile import decoder_blocks

    blocks = decoder_blocks(model)
    if blocks:
        return blocks
    raise EngineError(f"cannot find the decoder blocks (a ModuleList named 'layers') in {type(model).__name__}")
