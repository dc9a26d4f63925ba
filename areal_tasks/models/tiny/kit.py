"""Build tiny, randomly initialised Hugging Face causal LMs of real architectures.

``build_tiny_model("qwen2")`` returns a directory that ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load like any hub model: config.json, model.safetensors (fp32),
generation_config.json and the tiny tokenizer files. The model is built from the family's own
transformers config class at a tiny shape (hidden 64, 2 layers, 4 heads, 2 KV heads, MLP 128; MoE:
4 experts, top-2), so engines, weight sync and LoRA run against the real module tree in seconds.

Shapes are checked before anything is built (:func:`check_shape`: positive sizes within bounds,
heads divisible by KV heads, a parameter count a test model can have), and the output directory
before the model is built, so a bad ``--set`` or ``--out`` is a :class:`ModelError` (exit 2 in the
CLI), not a torch error or a traceback.

Entries are cached under :func:`~areal_tasks.models.tiny.cache.cache_root` by a hash of (family,
resolved config, seed, kit version, transformers version); a hit costs a ``stat``. torch and
transformers are imported only when a model is actually built.
"""

from __future__ import annotations

import json
import logging
from importlib import metadata
from pathlib import Path
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.dims import ModelDims
from areal_tasks.models.families import TEXT_MODEL_TYPE
from areal_tasks.models.tiny.cache import cache_root, content_hash, copy_tree_files, deliver, get_or_build
from areal_tasks.models.tiny.tokenizer_kit import (
    BOS_ID,
    ENDOFTEXT,
    EOS_ID,
    PAD_ID,
    SPECIAL_IDS,
    TINY_VOCAB_SIZE,
    build_tiny_tokenizer,
    tokenizer_cache_key,
)

logger = logging.getLogger(__name__)

KIT_VERSION = 1
MANIFEST = "areal_tiny.json"

_DENSE_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
}
_MOE_SHAPE: dict[str, dict[str, Any]] = {
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
    },
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}

#: the sizes an override may set, each a positive integer up to its bound (far above "tiny", far
#: below what would exhaust memory by a typo).
SIZE_BOUNDS: dict[str, int] = {
    "hidden_size": 16_384,
    "num_hidden_layers": 256,
    "num_attention_heads": 512,
    "num_key_value_heads": 512,
    "head_dim": 1024,
    "intermediate_size": 65_536,
    "max_position_embeddings": 1 << 20,
    "num_experts": 512,
    "num_local_experts": 512,
    "num_experts_per_tok": 512,
    "moe_intermediate_size": 65_536,
    "shared_expert_intermediate_size": 65_536,
}
#: the most parameters a model of the kit may have: beyond this it is a typo, not a test model.
MAX_TINY_PARAMS = 2 * 10**9

#: families the kit can build, dense first
TINY_FAMILIES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "mistral", "gemma", "qwen2_moe", "qwen3_moe", "mixtral")


def _unsupported(family: str) -> ModelError:
    from areal_tasks.models.tiny.vision_kit import VISION_FAMILIES

    choices = ", ".join((*TINY_FAMILIES, *VISION_FAMILIES))
    return ModelError(f"tiny model family {family!r} is not supported; choose one of {choices}")


def tiny_config(family: str, **config_overrides: Any) -> dict[str, Any]:
    """The config kwargs (for the family's transformers config class) of a tiny ``family`` model."""
    if family not in TINY_FAMILIES:
        raise _unsupported(family)
    config: dict[str, Any] = {
        **_DENSE_SHAPE,
        **_MOE_SHAPE.get(family, {}),
        "vocab_size": TINY_VOCAB_SIZE,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }
    config.update(config_overrides)
    if "head_dim" not in config_overrides:  # keep heads x head_dim == hidden when the width changes
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    return config


def check_config_keys(family: str, config_overrides: dict[str, Any]) -> None:
    """ModelError naming any override that is not a field of the family's transformers config.

    The config classes accept (and silently keep) unknown keyword arguments, so a typo such as
    ``hiden_size`` would otherwise build the default shape without a word.
    """
    from transformers import AutoConfig

    if family not in TINY_FAMILIES:
        raise _unsupported(family)
    known = set(AutoConfig.for_model(TEXT_MODEL_TYPE[family]).to_dict()) | set(tiny_config(family))
    unknown = sorted(set(config_overrides) - known)
    if unknown:
        raise ModelError(f"unknown {family} config key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")


def check_shape(family: str, config: dict[str, Any]) -> None:
    """ModelError naming every size of ``config`` (a :func:`tiny_config`) a model cannot be built with."""
    problems = []
    for key, bound in SIZE_BOUNDS.items():
        value = config.get(key)
        if key == "head_dim" and problems:
            continue  # derived from hidden_size and the heads: already reported through them
        if key in config and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= bound):
            hint = " (it follows hidden_size // num_attention_heads)" if key == "head_dim" else ""
            problems.append(f"{key}={value!r} must be an integer in 1..{bound:,}{hint}")
    if not problems:
        heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
        if heads % kv_heads:
            problems.append(f"num_attention_heads={heads} must be a multiple of num_key_value_heads={kv_heads}")
        experts = config.get("num_experts", config.get("num_local_experts"))
        per_token = config.get("num_experts_per_tok")
        if experts is not None and per_token is not None and per_token > experts:
            problems.append(f"num_experts_per_tok={per_token} must be <= the number of experts ({experts})")
    if problems:
        raise ModelError(f"tiny {family} model: {'; '.join(problems)}")
    params = ModelDims.from_text_config(family, config, source=f"tiny:{family}").num_params
    if params > MAX_TINY_PARAMS:
        raise ModelError(
            f"tiny {family} model: that shape has {params:,} parameters, more than the kit builds "
            f"({MAX_TINY_PARAMS:,}); use a real model directory for a model this large"
        )


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` expanded, if a directory can be made there (ModelError naming the file in the way)."""
    path = Path(out_dir).expanduser()
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise ModelError(f"cannot write the tiny model to {path}: {candidate} is a file, not a directory")
            break
    return path


def _transformers_version() -> str:
    return metadata.version("transformers")


def tiny_model_key(family: str, seed: int, config: dict[str, Any]) -> str:
    """Cache entry name of one tiny model."""
    payload = {
        "family": family,
        "seed": seed,
        "config": config,
        "kit": KIT_VERSION,
        "tokenizer": tokenizer_cache_key(),
        "transformers": _transformers_version(),
    }
    return f"{family}-s{seed}-{content_hash(payload)}"


def _write_model(directory: Path, family: str, seed: int, config_kwargs: dict[str, Any], tokenizer_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.for_model(TEXT_MODEL_TYPE[family], **config_kwargs)
    config.dtype = "float32"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID,
        eos_token_id=[EOS_ID, SPECIAL_IDS[ENDOFTEXT]],  # end of turn, then end of document
        pad_token_id=PAD_ID,
    )
    model.save_pretrained(str(directory))
    copy_tree_files(tokenizer_dir, directory)
    manifest = {"family": family, "seed": seed, "config": config_kwargs, "kit_version": KIT_VERSION}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")


def build_tiny_model(
    family: str,
    seed: int = 0,
    out_dir: str | Path | None = None,
    *,
    cache_dir: str | Path | None = None,
    **config_overrides: Any,
) -> Path:
    """Build (or reuse from the cache) a tiny random ``family`` model and return its directory.

    ``seed`` fixes the weights; ``config_overrides`` change the shape (e.g. ``num_hidden_layers=4``);
    a key the family's config class does not define is a ModelError. ``head_dim`` follows
    ``hidden_size // num_attention_heads`` unless it is overridden itself. Vision-language families
    (:data:`~areal_tasks.models.tiny.vision_kit.VISION_FAMILIES`) are built by
    :func:`~areal_tasks.models.tiny.vision_kit.build_tiny_vlm`.
    With ``out_dir`` the files are copied there and ``out_dir`` is returned; otherwise the cache
    entry itself is returned (treat it as read-only).
    """
    from areal_tasks.models.tiny.vision_kit import VISION_FAMILIES, build_tiny_vlm

    if family in VISION_FAMILIES:
        return build_tiny_vlm(family, seed, out_dir, cache_dir=cache_dir, **config_overrides)
    if config_overrides:  # the check imports transformers; a plain cache hit stays a stat
        check_config_keys(family, config_overrides)
    config = tiny_config(family, **config_overrides)
    if config["vocab_size"] != TINY_VOCAB_SIZE:
        raise ModelError(
            f"tiny model vocab_size={config['vocab_size']!r} must equal the tiny tokenizer length {TINY_VOCAB_SIZE}; "
            "drop the vocab_size override"
        )
    check_shape(family, config)
    target = None if out_dir is None else check_out_dir(out_dir)
    root = cache_root(cache_dir)

    def build(tmp: Path) -> None:
        logger.info("building tiny %s model (seed %d) under %s", family, seed, root)
        _write_model(tmp, family, seed, config, build_tiny_tokenizer(cache_dir))

    cached = get_or_build(root, tiny_model_key(family, seed, config), build)
    return deliver(cached, target)
