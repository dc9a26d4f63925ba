"""The critic variant: the policy's architecture with a scalar value head instead of the LM head.

It is the HF ``*ForTokenClassification`` model with ``num_labels=1`` (a ``score`` linear layer on
the final hidden states), so a saved critic is a plain HF checkpoint. Started from a causal-LM
checkpoint, the head is missing and is initialised here from a fixed seed, identically on every
rank. Classifier dropout is switched off: values must be deterministic.

Alignment: the value at token ``t`` is the head applied to the hidden state at ``t - 1`` (the state
from which token ``t`` is generated), exactly like log-probabilities; the first token of every
sequence gets 0 (see :mod:`areal_tasks.kernels.logprobs`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

HEAD_SEED = 20240531


def load_critic(path: str, **from_pretrained_kwargs: Any) -> torch.nn.Module:
    """A token-classification model with one output per token, head initialised when missing."""
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(path)
    config.num_labels = 1
    config.classifier_dropout = 0.0
    model, info = AutoModelForTokenClassification.from_pretrained(
        path, config=config, output_loading_info=True, **from_pretrained_kwargs
    )
    missing = set(info.get("missing_keys", ()))
    if any(key.startswith("score.") for key in missing):
        gen = torch.Generator().manual_seed(HEAD_SEED)
        with torch.no_grad():
            weight = model.score.weight
            std = 1.0 / math.sqrt(weight.shape[1] + 1)
            weight.copy_(torch.randn(weight.shape, generator=gen, dtype=torch.float32).mul_(std).to(weight.dtype))
            if model.score.bias is not None:
                model.score.bias.zero_()
        logger.info("critic value head initialised (seed %d)", HEAD_SEED)
    return model


def values_per_position(logits: torch.Tensor) -> torch.Tensor:
    """``[1, N, 1]`` head outputs -> ``[N]`` fp32 values (position ``t`` = value of state after token ``t``)."""
    return logits.reshape(-1).float()
