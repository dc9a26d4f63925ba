"""Sharded HF safetensors: the layout every server and ``transformers`` read.

Directories are written whole through :func:`storage.atomic.atomic_directory` (readers see the old
directory or the new one, never half). :func:`write_safetensors_shards` writes ``model.safetensors``
or, above ``max_shard_bytes``, ``model-0000i-of-0000n.safetensors`` shards plus
``model.safetensors.index.json``, the layout that ``transformers.from_pretrained`` and every
inference server read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from areal_tasks.errors import ModelError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def plan_shards(sizes: Mapping[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Group tensor names, in order, into shards of at most ``max_shard_bytes`` (a bigger tensor gets its own)."""
    if max_shard_bytes < 1:
        raise ModelError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return [s for s in shards if s]


def write_safetensors_shards(
    state_dict: Mapping[str, torch.Tensor],
    directory: str | os.PathLike[str],
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    metadata: Mapping[str, str] | None = None,
) -> list[str]:
    """Write ``state_dict`` (CPU tensors) as HF safetensors shards into ``directory``; return file names."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = {name: t.detach().contiguous() for name, t in state_dict.items()}
    shards = plan_shards({name: _nbytes(t) for name, t in tensors.items()}, max_shard_bytes)
    meta = {"format": "pt", **(metadata or {})}
    if len(shards) <= 1:
        save_file(tensors, str(directory / SINGLE_FILE), metadata=meta)
        return [SINGLE_FILE]
    files, weight_map = [], {}
    for i, names in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(directory / fname), metadata=meta)
        files.append(fname)
        weight_map.update(dict.fromkeys(names, fname))
    index = {"metadata": {"total_size": sum(_nbytes(t) for t in tensors.values())}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
    return files


def read_safetensors_dir(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read every tensor of a directory written by :func:`write_safetensors_shards` (or HF)."""
    from safetensors.torch import load_file

    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / SINGLE_FILE).exists():
        files = [SINGLE_FILE]
    else:
        raise ModelError(f"{directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    out: dict[str, torch.Tensor] = {}
    for fname in files:
        out.update(load_file(str(directory / fname)))
    return out
