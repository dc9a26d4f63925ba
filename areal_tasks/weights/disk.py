"""Disk weight updates: rank 0 writes an HF safetensors directory, every server reads it.

* **Trainer** (:class:`DiskTransport`): before the servers pause, every rank takes part in the
  source's gathers and rank 0 writes ``<weights dir>/v<version>``: sharded safetensors
  (``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` shards plus
  ``model.safetensors.index.json``; :mod:`areal_tasks.models.safetensors_dir`), ``config.json`` and
  the tokenizer files, through :func:`~areal_tasks.models.hf_dir.write_hf_dir`, atomically. The
  servers stop only for the load. After they resume, directories older than the newest
  :data:`KEEP_WEIGHT_DIRS` are removed.
* **Server** (:class:`DiskReceiver`): reads the index's shards, else every ``*.safetensors`` of the
  directory. The embedded server stages them all and checks every name and shape against the
  served model, requiring every parameter (tied aliases count once); vLLM streams them file by
  file into its own loader (:func:`iter_safetensors`), holding at most one shard besides the model.
* **Hostile input.** The path comes from whoever may call the server's admin routes: the directory
  and every shard must lie inside the server's weight roots (:mod:`areal_tasks.weights.roots`),
  the index is checked against its schema and every file's header is read before any tensor, so
  a bad directory fails as :class:`WeightTransportError` (an HTTP 400) before the model changes.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import WeightTransportError
from areal_tasks.models.safetensors_dir import INDEX_FILE
from areal_tasks.weights.base import ServedWeights, WeightLoad, WeightReceiver, WeightTransport, rank_barrier
from areal_tasks.weights.roots import WeightRoots

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec

logger = logging.getLogger(__name__)

__all__ = [
    "KEEP_WEIGHT_DIRS",
    "DiskReceiver",
    "DiskTransport",
    "iter_safetensors",
    "load_safetensors_dir",
    "safetensors_files",
    "safetensors_headers",
]

#: weight-update directories kept on disk (the newest ones).
KEEP_WEIGHT_DIRS = 2


class DiskTransport(WeightTransport):
    """``disk``: sharded safetensors written by rank 0 before the pause, loaded by every server."""

    name: ClassVar[str] = "disk"

    def plan(self, version: int) -> WeightUpdateMeta:
        return WeightUpdateMeta.disk(str(self.context.weights_dir / f"v{version}"), version)

    def send(self, meta: WeightUpdateMeta) -> None:
        """Gather (every rank) and write (rank 0) the weights under ``meta.path``, floating-point
        tensors in their specs' dtype; then wait for every rank."""
        stream = self.source.iter_weights()
        if not self.is_sender:  # take part in every gather; rank 0 writes
            collections.deque(stream, maxlen=0)
        else:
            self._write(meta, stream)
            logger.info("weights version %d written to %s", meta.version, meta.path)
        rank_barrier()

    def _write(self, meta: WeightUpdateMeta, stream: Iterator[tuple[str, torch.Tensor]]) -> None:
        from areal_tasks.models.hf_dir import write_hf_dir
        from areal_tasks.weights.buckets import check_bucket_tensor, dtype_of

        if not meta.path:
            raise WeightTransportError("a disk weight update needs meta.path")
        specs = {spec.name: spec for spec in self.source.weight_specs()}
        tensors = {}
        for name, tensor in stream:
            spec = specs.get(name)
            if spec is None:
                raise WeightTransportError(f"the weights to write include {name!r}, which the source's specs lack")
            check_bucket_tensor(spec, tensor)
            dtype = dtype_of(spec.dtype)
            tensors[name] = (tensor.to(dtype) if tensor.dtype != dtype else tensor).cpu()
        missing = sorted(set(specs) - set(tensors))
        if missing:
            raise WeightTransportError(f"the weights to write lack {len(missing)} of their specs, e.g. {missing[:3]}")
        write_hf_dir(
            meta.path,
            tensors,
            self.source.hf_config(),
            source_dir=self.source.model_path,
            on_exists="replace_owned",
        )

    def server_update(self, meta: WeightUpdateMeta) -> tuple[WeightUpdateMeta, list[list[ParamSpec]] | None]:
        return meta, None

    def retire(self, meta: WeightUpdateMeta) -> None:
        """Remove the weight directories older than the newest :data:`KEEP_WEIGHT_DIRS`."""
        for old in range(meta.version - KEEP_WEIGHT_DIRS, 0, -1):
            path = self.context.weights_dir / f"v{old}"
            if not path.exists():
                break
            shutil.rmtree(path, ignore_errors=False)

    @classmethod
    def receiver(cls, device: torch.device) -> DiskReceiver:
        return DiskReceiver(device)


class DiskReceiver(WeightReceiver):
    """A server's end: reads the directory a load names, inside ``roots`` (None: any directory,
    its shards inside it; :mod:`areal_tasks.weights.roots`)."""

    def __init__(self, device: torch.device, roots: WeightRoots | None = None) -> None:
        self.device = device
        self.roots = roots

    def receive(self, load: WeightLoad, served: ServedWeights | None = None) -> dict[str, torch.Tensor]:
        """Every tensor of ``load.path`` on this receiver's device: with ``served``, only served
        weights, checked (all of them required) and in the served dtypes; else all, as stored."""
        if not load.path:
            raise WeightTransportError("a disk weight load needs the directory's path")
        if served is None:
            files = safetensors_files(load.path, self.roots)
            return {name: t.to(self.device) for name, t in iter_safetensors(files)}
        return load_safetensors_dir(load.path, served, self.device, self.roots)


def safetensors_files(directory: str | os.PathLike[str], roots: WeightRoots | None = None) -> list[Path]:
    """The safetensors files of ``directory`` (resolved): the index's shards, else every
    ``*.safetensors``; each inside ``roots`` (None: ``directory`` is the only root).

    Raises :class:`WeightTransportError` for a directory or shard that is missing or outside the
    roots (one message for both, :func:`~areal_tasks.weights.roots.not_readable`) and for an index
    that is not JSON or has no ``weight_map`` of tensor names to shard names.
    """
    roots = WeightRoots.of([directory]) if roots is None else roots
    resolved = roots.directory(directory)
    if (resolved / INDEX_FILE).exists() or (resolved / INDEX_FILE).is_symlink():
        names = _indexed_shards(roots.shard(resolved, INDEX_FILE))
    else:
        names = sorted(p.name for p in resolved.glob("*.safetensors"))
        if not names:
            raise WeightTransportError(f"weight directory {os.fspath(directory)!r} holds no *.safetensors file")
    return [roots.shard(resolved, name) for name in names]


def _indexed_shards(index: Path) -> list[str]:
    """The shard names of a ``model.safetensors.index.json``, checked: a JSON object whose
    ``weight_map`` maps tensor names to shard names (strings), at least one."""
    try:
        parsed = json.loads(index.read_bytes())
    except OSError as exc:
        raise WeightTransportError(f"cannot read {INDEX_FILE}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise WeightTransportError(f"{INDEX_FILE} is not valid JSON: {exc}") from exc
    weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise WeightTransportError(
            f"{INDEX_FILE} has no 'weight_map' object of tensor name -> shard file "
            f"(got {type(weight_map).__name__ if weight_map is not None else 'none'})"
        )
    bad = [name for name, shard in weight_map.items() if not isinstance(shard, str)]
    if bad:
        raise WeightTransportError(f"{INDEX_FILE}: 'weight_map' values must be shard file names, not for {bad[:3]}")
    return sorted(set(weight_map.values()))


def safetensors_headers(files: list[Path]) -> dict[str, Path]:
    """``tensor name -> file`` from the headers of ``files`` (no tensor data is read).

    Raises :class:`WeightTransportError` for a file that is not safetensors (garbage, truncated)
    and for a tensor stored in two files, before anything is loaded.
    """
    from safetensors import SafetensorError, safe_open

    where: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                names = list(handle.keys())
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise WeightTransportError(f"{file.name} is not a readable safetensors file: {exc}") from exc
        for name in names:
            if name in where:
                raise WeightTransportError(f"tensor {name!r} is stored twice: in {where[name].name} and {file.name}")
            where[name] = file
    return where


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor in ``files`` (CPU), file by file, after every file's
    header was checked (:func:`safetensors_headers`), so a bad shard fails before any tensor is
    yielded. Raises :class:`WeightTransportError` for a file whose data cannot be read."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    safetensors_headers(files)
    for file in files:
        try:
            tensors = load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise WeightTransportError(f"{file.name} is not a readable safetensors file: {exc}") from exc
        yield from tensors.items()


def load_safetensors_dir(
    path: str | os.PathLike[str], served: ServedWeights, device: torch.device, roots: WeightRoots | None = None
) -> dict[str, torch.Tensor]:
    """Read and check a HF safetensors directory into tensors on ``device`` in the served dtypes.

    Per-expert checkpoint tensors are stacked into the served model's expert weights
    (:mod:`~areal_tasks.weights.expert_fold`); tensors the served model has no weight for are
    skipped; every required one must be there. ``roots``: as :func:`safetensors_files`.
    """
    from areal_tasks.weights.expert_fold import fold_expert_tensors

    named: dict[str, torch.Tensor] = {}
    stored = fold_expert_tensors(dict(iter_safetensors(safetensors_files(path, roots))), served.specs)
    for name, tensor in stored.items():
        if name in served.specs:
            named[name] = tensor
        else:
            logger.debug("ignoring %s: not a weight of the served model", name)
    served.check(named, complete=True)
    return {n: t.to(device=device, dtype=served.specs[n][1]) for n, t in named.items()}
