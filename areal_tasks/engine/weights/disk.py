"""Sharded HF safetensors written atomically: readers see the old directory or the new one, never half.

:func:`atomic_directory` builds the content in a hidden sibling directory, fsyncs it and renames it
into place (an existing directory is moved aside first and removed after the swap).
:func:`write_safetensors_shards` writes ``model.safetensors`` or, above ``max_shard_bytes``,
``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json``, the layout that
``transformers.from_pretrained`` and every inference server read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(dirpath))


def _make_readable(root: Path) -> None:
    """World-readable files and directories: servers may run as another user (writers such as
    safetensors create files 0600)."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


@contextlib.contextmanager
def atomic_directory(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging directory; on success it replaces ``target`` in one rename.

    On an exception the staging directory is removed and ``target`` is left as it was.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        _make_readable(staging)
        _fsync_tree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    os.rename(staging, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old)
    logger.info("wrote %s", target)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def plan_shards(sizes: Mapping[str, int], max_shard_bytes: int) -> list[list[str]]:
    """Group tensor names, in order, into shards of at most ``max_shard_bytes`` (a bigger tensor gets its own)."""
    if max_shard_bytes < 1:
        raise EngineError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
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
        raise EngineError(f"{directory} holds neither {SINGLE_FILE} nor {INDEX_FILE}")
    out: dict[str, torch.Tensor] = {}
    for fname in files:
        out.update(load_file(str(directory / fname)))
    return out
