"""LoRA: which modules to adapt per family, peft wrapping, and adapter export or merging.

Dense families adapt all attention and MLP projections (the usual recipe that matches full
fine-tuning best). MoE families adapt attention only by default: their routed experts are stored
as fused 3-D expert tensors (not ``nn.Linear`` modules a LoRA adapter can wrap), a per-expert
adapter multiplies adapter memory by the expert count, and adapting the router destabilises
routing. Pass ``target_modules`` explicitly to go further (e.g. a Qwen2-MoE shared expert's
``gate_proj``/``up_proj``/``down_proj``). A vision-language model's default adapters sit in its
language model only (:func:`language_model_targets`); its vision tower is frozen.

:func:`apply_lora` wraps a model with peft so only the adapters train (any engine). Export works
on the *full* (gathered) state dict of the peft-wrapped model, whose keys look like
``base_model.model.<hf name with .base_layer>`` and ``...<module>.lora_A.<adapter>.weight``:

* :func:`adapter_state_dict` keeps the adapter tensors under peft's file naming (what
  ``PeftModel.from_pretrained`` reads);
* :class:`LoraMerger` turns the stream into plain HF names with ``W = W0 + scaling * B @ A`` folded
  in, so an inference server that knows nothing about LoRA can load it (the engine's HF save and
  the checkpoint export both use it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ModelError
from areal_tasks.models.families import FAMILIES, canonical_family, traits

if TYPE_CHECKING:
    import torch

    from areal_tasks.config.engine import LoRAConfig

logger = logging.getLogger(__name__)

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
#: DeepSeek latent attention (q_proj exists instead of q_a/q_b when q_lora_rank is null)
MLA = ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
#: how peft prefixes the wrapped model's state-dict names, and the one adapter trained and merged
PEFT_PREFIX = "base_model.model."
ADAPTER = "default"


def lora_target_modules(family: str) -> list[str]:
    """Module names (suffixes, as peft matches them) to adapt for ``family``.

    ``family`` may also be a transformers ``model_type`` (``model.config.model_type``).
    Vision-language families return their language model's targets.
    """
    family = canonical_family(family)
    if family not in FAMILIES:
        raise ModelError(
            f"no default LoRA targets for model family {family!r} (known: {', '.join(sorted(FAMILIES))}); "
            "pass target_modules explicitly, e.g. ['q_proj', 'k_proj', 'v_proj', 'o_proj']"
        )
    family_traits = traits(family)
    if family_traits.attention == "mla":
        return list(MLA)
    if family_traits.is_moe:
        return list(ATTENTION)
    return ATTENTION + MLP


def build_lora_config(
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: list[str] | None,
    family: str,
) -> Any:
    """A ``peft.LoraConfig`` for a causal LM; ``target_modules`` None means the family defaults."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise ModelError(f"lora rank={rank!r} must be a positive integer (e.g. 16)")
    if alpha <= 0:
        raise ModelError(f"lora alpha={alpha!r} must be positive (commonly 2 x rank)")
    if not 0.0 <= dropout < 1.0:
        raise ModelError(f"lora dropout={dropout!r} must be in [0, 1)")
    targets = list(target_modules) if target_modules is not None else lora_target_modules(family)
    if not targets:
        raise ModelError("lora target_modules is empty; pass module names or None for the family defaults")
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )


def default_target_modules(model_type: str) -> list[str]:
    """The default LoRA targets of a family (``model.config.model_type``)."""
    return list(lora_target_modules(model_type))


def language_model_targets(model_type: str, names: Iterable[str]) -> str | list[str]:
    """``names`` as peft targets that stay inside a vision-language model's language model (a regex
    over module paths: Qwen2.5-VL's vision blocks have ``gate_proj``/``up_proj``/``down_proj`` too);
    the plain list for a text family."""
    import re

    family = canonical_family(model_type)
    if family not in FAMILIES or not traits(family).is_vision_language:
        return list(names)
    alternatives = "|".join(re.escape(name) for name in names)
    return rf"(?:.*\.)?language_model\..*\.(?:{alternatives})"


def peft_lora_config(cfg: LoRAConfig, model_type: str) -> object:
    """The peft ``LoraConfig`` of ``cfg`` (default targets from the model kit; a vision-language
    model's stay in its language model, so its vision tower is frozen with the other base weights)."""
    from peft import LoraConfig

    targets = cfg.target_modules or language_model_targets(model_type, default_target_modules(model_type))
    return LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets, bias="none")


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig, seed: int) -> torch.nn.Module:
    """Wrap ``model`` with peft LoRA adapters; the base weights are frozen.

    The adapters are initialised under ``seed`` (the global RNG is left untouched), so every rank
    and any single-process reference built the same way start from the same adapters.
    """
    import torch
    from peft import get_peft_model

    peft_cfg = peft_lora_config(cfg, model.config.model_type)
    targets = peft_cfg.target_modules
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        wrapped = get_peft_model(model, peft_cfg)
    n_train = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    if n_train == 0:
        raise ModelError(f"LoRA target_modules {targets} matched no module of {type(model).__name__}")
    logger.info("LoRA r=%d alpha=%s on %s: %d trainable parameters", cfg.rank, cfg.alpha, targets, n_train)
    return wrapped


def lora_scalings(model: torch.nn.Module) -> dict[str, float]:
    """``{hf module name: scaling}`` of every LoRA layer of a peft model."""
    out = {}
    for name, module in model.named_modules():
        scaling = getattr(module, "scaling", None)
        if isinstance(scaling, dict) and ADAPTER in scaling:
            out[_hf_name(name)] = float(scaling[ADAPTER])
    return out


def _hf_name(name: str) -> str:
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer", "")


def adapter_state_dict(model: torch.nn.Module, full_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors of ``full_state`` under peft's file naming."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, state_dict=full_state, adapter_name=ADAPTER)


class LoraMerger:
    """Rewrites a stream of full peft tensors into plain HF tensors with the adapters merged."""

    def __init__(self, scalings: dict[str, float]) -> None:
        self.scalings = scalings
        self._pending: dict[str, dict[str, torch.Tensor]] = {}

    def __call__(self, named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named:
            yield from self._push(name, tensor)
        if self._pending:
            raise ModelError(f"incomplete LoRA layers in the state dict: {sorted(self._pending)}")

    def _push(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        if f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name:
            part = "A" if ".lora_A." in name else "B"
            module, kind = name.split(f".lora_{part}.{ADAPTER}.")
            key = _hf_name(module) + "." + kind
            yield from self._collect(key, part, tensor)
        elif ".base_layer." in name:
            module, kind = name.split(".base_layer.")
            key = _hf_name(module) + "." + kind
            if kind == "weight":
                yield from self._collect(key, "W", tensor)
            else:  # a bias: adapters do not touch it
                yield key, tensor
        elif ".lora_" in name:
            raise ModelError(f"unsupported LoRA tensor {name!r} (only the {ADAPTER!r} adapter's A/B are merged)")
        else:
            yield _hf_name(name), tensor

    def _collect(self, key: str, part: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        parts = self._pending.setdefault(key, {})
        parts[part] = tensor
        if len(parts) == 3:
            del self._pending[key]
            module = key.rsplit(".", 1)[0]
            if module not in self.scalings:
                raise ModelError(f"no LoRA scaling known for module {module!r}")
            base = parts["W"]
            delta = (parts["B"].float() @ parts["A"].float()) * self.scalings[module]
            yield key, (base.float() + delta).to(base.dtype)
