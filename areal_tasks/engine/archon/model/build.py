"""Build an :class:`ArchonDecoder` from a Hugging Face model directory.

The module tree is made on the meta device (no memory, no init), cast, materialised on the target
device and filled from the directory's safetensors through :func:`hf_io.hf_to_archon`. Every weight
must come from the checkpoint, with two exceptions: the tied LM head (it is the embedding), and the
critic's value head when the checkpoint is a causal LM: it is then initialised exactly as the FSDP
engine's critic initialises it (:mod:`areal_tasks.models.critic`: a fixed seed, identical on every
rank, std ``1/sqrt(H + 1)``, bias zero), and the LM head the checkpoint carries is dropped.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from areal_tasks.engine.archon.model.args import ArchonArgs
from areal_tasks.engine.archon.model.decoder import ArchonDecoder
from areal_tasks.engine.archon.model.hf_io import hf_to_archon
from areal_tasks.errors import ModelError
from areal_tasks.models.critic import HEAD_SEED
from areal_tasks.models.safetensors_dir import read_safetensors_dir

logger = logging.getLogger(__name__)


def load_args(model_dir: str | os.PathLike[str]) -> ArchonArgs:
    """The :class:`ArchonArgs` of the config in ``model_dir``."""
    from transformers import AutoConfig

    return ArchonArgs.from_hf(AutoConfig.from_pretrained(str(model_dir)))


def init_value_head(model: ArchonDecoder) -> None:
    """The critic head as :func:`areal_tasks.models.critic.load_critic` initialises a missing one."""
    head = model.value_head
    if head is None:
        raise ModelError("this model has no value head to initialise")
    gen = torch.Generator().manual_seed(HEAD_SEED)
    with torch.no_grad():
        std = 1.0 / math.sqrt(head.weight.shape[1] + 1)
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen, dtype=torch.float32).mul_(std))
        if head.bias is not None:
            head.bias.zero_()
    logger.info("critic value head initialised (seed %d)", HEAD_SEED)


def build_decoder(
    model_dir: str | os.PathLike[str],
    *,
    role: str = "actor",
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[ArchonDecoder, ArchonArgs]:
    """The decoder of ``model_dir`` with its weights, on ``device`` in ``dtype``, and its args."""
    args = load_args(model_dir)
    with torch.device("meta"):
        model = ArchonDecoder(args, role=role)
    model = model.to(dtype).to_empty(device=device)
    model.tie_weights()
    state = hf_to_archon(read_safetensors_dir(model_dir), args)
    if role == "critic":
        state.pop("lm_head.weight", None)
    elif any(name.startswith("value_head.") for name in state):
        raise ModelError(f"{model_dir} is a critic checkpoint (it has score.*); it cannot be built as an actor")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected:
        raise ModelError(f"{model_dir}: tensors the {args.model_type} decoder has no place for: {sorted(unexpected)}")
    allowed = {"lm_head.weight"} if args.tie_word_embeddings else set()
    head_missing = role == "critic" and {"value_head.weight", "value_head.bias"} & set(missing)
    allowed |= {"value_head.weight", "value_head.bias"} if head_missing else set()
    if left := sorted(set(missing) - allowed):
        raise ModelError(f"{model_dir}: the checkpoint lacks {left}")
    if head_missing:
        init_value_head(model)
    logger.info("built the archon %s decoder of %s (%s, %s)", args.model_type, model_dir, role, dtype)
    return model, args
