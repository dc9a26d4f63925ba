"""The archon engine's model: a plain-PyTorch decoder (dense and MoE), its args, HF name map and builder."""

from __future__ import annotations

from areal_tasks.engine.archon.model.args import ArchonArgs
from areal_tasks.engine.archon.model.build import build_decoder
from areal_tasks.engine.archon.model.decoder import ArchonDecoder
from areal_tasks.engine.archon.model.moe import moe_aux_loss

__all__ = ["ArchonArgs", "ArchonDecoder", "build_decoder", "moe_aux_loss"]
