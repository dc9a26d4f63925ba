"""The HF model directory: weights as safetensors shards, ``config.json`` and the tokenizer files.

:func:`write_hf_dir` is the one writer of HF directories (an engine's HF save, a disk weight update,
the checkpoint export): it writes the directory atomically, with the config cleaned of engine-only
settings (:func:`export_config`) and the tokenizer and generation files copied from the model the
weights came from (:func:`hf_side_file_paths`). :func:`hf_config_of` finds the HF config of a plain
or peft-wrapped model; :func:`hf_sidecar_files` is what a checkpoint keeps to write one later.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.models.safetensors_dir import DEFAULT_MAX_SHARD_BYTES, write_safetensors_shards
from storage.atomic import atomic_directory
from storage.ownership import OnExists

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: files copied from the source model directory next to exported weights (tokenizer, generation).
HF_SIDE_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
)


def is_peft_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` is peft-wrapped (its parameters live under ``base_model.model.``)."""
    return any(name.startswith("base_model.model.") for name, _ in model.named_parameters())


def hf_config_of(model: torch.nn.Module) -> Any:
    """The HF config of a plain or peft-wrapped model (None when the model has none)."""
    if is_peft_model(model):
        return getattr(model.base_model.model, "config", None)
    return getattr(model, "config", None)


def export_config(config: Any) -> Any:
    """A copy of ``config`` without the engine-only attention implementation (the engine's
    attention kernel is not part of the model)."""
    import copy

    out = copy.deepcopy(config)
    for attr in ("_attn_implementation_internal", "_attn_implementation"):
        if attr in out.__dict__:
            out.__dict__[attr] = None
    return out


def hf_side_file_paths(source_dir: str | os.PathLike[str] | None) -> list[Path]:
    """The :data:`HF_SIDE_FILES` present in ``source_dir`` (none when it is not a directory)."""
    if source_dir is None or not Path(source_dir).is_dir():
        return []
    return [Path(source_dir) / fname for fname in HF_SIDE_FILES if (Path(source_dir) / fname).is_file()]


def hf_sidecar_files(config: Any, source_dir: str | os.PathLike[str] | None) -> dict[str, bytes]:
    """``{file name: bytes}`` that turn bare weights into an HF directory later: ``config.json``
    (cleaned by :func:`export_config`) and the tokenizer files of ``source_dir``; empty without a
    config that can be saved (a checkpoint keeps them next to its weights)."""
    if config is None or not hasattr(config, "to_json_string"):
        return {}
    out = {"config.json": export_config(config).to_json_string().encode("utf-8")}
    for path in hf_side_file_paths(source_dir):
        out[path.name] = path.read_bytes()
    return out


def write_hf_dir(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    config: Any,
    *,
    source_dir: str | os.PathLike[str] | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_json: Mapping[str, str] | None = None,
    on_exists: OnExists = "refuse",
) -> None:
    """Atomically write an HF model directory: safetensors shards, ``config.json``, tokenizer files.

    ``on_exists`` (:func:`storage.atomic.atomic_directory`): ``refuse`` an existing non-empty
    ``path`` (the default: a user's directory is never replaced), ``replace_owned`` for writers that
    own the place (a weight update's version directory, an engine's HF save), ``merge_owned`` to
    write next to foreign files while replacing only an earlier output of ours (``export --force``).
    """
    with atomic_directory(path, on_exists=on_exists) as staging:
        write_safetensors_shards(tensors, staging, max_shard_bytes=max_shard_bytes)
        export_config(config).save_pretrained(staging)
        for fname, text in (extra_json or {}).items():
            (staging / fname).write_text(text)
        for src in hf_side_file_paths(source_dir):
            shutil.copy2(src, staging / src.name)
