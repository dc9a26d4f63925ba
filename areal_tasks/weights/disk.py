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
"""

from __future__ import annotations

import collections
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import WeightTransportError
from areal_tasks.models.safetensors_dir import INDEX_FILE
from areal_tasks.weights.base import ServedWeights, WeightLoad, WeightReceiver, WeightTransport, rank_barrier

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
    """A server's end: reads the directory a load names."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def receive(self, load: WeightLoad, served: ServedWeights | None = None) -> dict[str, torch.Tensor]:
        """Every tensor of ``load.path`` on this receiver's device: with ``served``, only served
        weights, checked (all of them required) and in the served dtypes; else all, as stored."""
        if not load.path:
            raise WeightTransportError("a disk weight load needs the directory's path")
        if served is None:
            return {name: t.to(self.device) for name, t in iter_safetensors(safetensors_files(Path(load.path)))}
        return load_safetensors_dir(load.path, served, self.device)


def safetensors_files(directory: Path) -> list[Path]:
    """The safetensors files of ``directory``: the index's shards, else every ``*.safetensors``."""
    directory = directory.expanduser()
    if not directory.is_dir():
        raise WeightTransportError(f"weight directory {directory} does not exist or is not a directory")
    index = directory / INDEX_FILE
    if index.is_file():
        files = [directory / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise WeightTransportError(f"{index} lists shards that do not exist: {absent}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightTransportError(f"weight directory {directory} holds no *.safetensors file")
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every tensor in ``files`` (CPU), file by file."""
    from safetensors.torch import load_file

    for file in files:
        yield from load_file(str(file), device="cpu").items()


def load_safetensors_dir(path: str, served: ServedWeights, device: torch.device) -> dict[str, torch.Tensor]:
    """Read and check a HF safetensors directory into tensors on ``device`` in the served dtypes.

    Tensors the served model has no weight for are skipped; every required one must be there.
    """
    named: dict[str, torch.Tensor] = {}
    for file in safetensors_files(Path(path)):
        for name, tensor in iter_safetensors([file]):
            if name in served.specs:
                named[name] = tensor
            else:
                logger.debug("ignoring %s from %s: not a weight of the served model", name, file.name)
    served.check(named, complete=True)
    return {n: t.to(device=device, dtype=served.specs[n][1]) for n, t in named.items()}
