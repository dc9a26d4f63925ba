"""Reading a weight directory the trainer wrote: HF safetensors, one file or index + shards.

The trainer publishes a policy version as ``model.safetensors`` or ``model-0000i-of-0000n
.safetensors`` + ``model.safetensors.index.json`` (``areal_tasks.models.safetensors_dir``, written
atomically). Tensors are yielded one file at a time, so a server holds at most one shard in memory
besides what it is loading into.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

from areal_tasks.errors import InferenceError
from areal_tasks.models.safetensors_dir import INDEX_FILE

logger = logging.getLogger(__name__)

__all__ = ["iter_safetensors", "safetensors_files"]


def safetensors_files(directory: Path) -> list[Path]:
    """The safetensors files of ``directory``: the index's shards, else every ``*.safetensors``."""
    if not directory.is_dir():
        raise InferenceError(f"weight directory {directory} does not exist or is not a directory")
    index = directory / INDEX_FILE
    if index.is_file():
        files = [directory / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise InferenceError(f"{index} lists shards that do not exist: {absent}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise InferenceError(f"weight directory {directory} holds no *.safetensors file")
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor in ``files`` (CPU), file by file."""
    from safetensors.torch import load_file

    for file in files:
        yield from load_file(str(file), device="cpu").items()
