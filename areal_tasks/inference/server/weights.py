"""Weight updates of the embedded server: from a safetensors directory, or received over a process group.

Both paths stage the complete new weights first and validate every name, shape and dtype against
the served model; only then does the engine copy them into the model, between two decode steps
(see ``app.py``), so a sequence never runs a step on half-updated weights and a failed update
changes nothing.

Disk (SGLang ``/update_weights_from_disk``): ``model.safetensors`` or the shards listed by
``model.safetensors.index.json`` (any ``*.safetensors`` when there is no index). Every parameter
of the model must be present (tied aliases count once).

Collective (SGLang ``/init_weights_update_group`` + ``/update_weights_from_distributed``): the
group is built exactly like SGLang's ``init_custom_process_group``: TCP rendezvous at
``tcp://master_address:master_port`` (trainer rank 0 hosts the store), a ``PrefixStore`` named
after the group, then ``torch.distributed``'s own process-group constructor (the one function
both sides call: ``engine/weights/collective.py``), so the trainer side can be any
SGLang-compatible sender. This server's rank is ``rank_offset`` (it has no tensor
parallelism). One update is, in the order of ``names``, one broadcast from rank 0 per tensor, or
with ``load_format="flattened_bucket"`` a single ``uint8`` broadcast holding all tensors back to
back (each at an offset aligned to its element size), as SGLang's ``FlattenedTensorBucket``.

Shared (this server's ``/areal/update_weights_from_shared``, for servers on the trainer's host):
the trainer's buffer on this server's device (``engine/weights/shared.py``) holds the tensors laid
out as one flattened bucket; :class:`SharedBufferReader` opens it once and hands out views of it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.model_runner import on_device

logger = logging.getLogger(__name__)

_INDEX = "model.safetensors.index.json"


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / _INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise InferenceError(f"{model_dir}: no *.safetensors files")
    return files


def check_tensors(
    named: dict[str, torch.Tensor], specs: dict[str, tuple[tuple[int, ...], torch.dtype]], required: set[str] | None
) -> None:
    """Raise :class:`InferenceError` unless every tensor matches a served weight by name and shape
    (and, with ``required``, every required name is present)."""
    unknown = sorted(set(named) - set(specs))
    if unknown:
        raise InferenceError(f"weights {unknown[:5]} (of {len(unknown)}) are not in the served model")
    wrong = [f"{n}: {tuple(t.shape)} != {specs[n][0]}" for n, t in named.items() if tuple(t.shape) != specs[n][0]]
    if wrong:
        raise InferenceError(f"shape mismatch: {wrong[:5]}")
    if required is not None:
        missing = sorted(required - set(named))
        if missing:
            raise InferenceError(f"the checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")


def load_safetensors_dir(
    path: str, specs: dict[str, tuple[tuple[int, ...], torch.dtype]], required: set[str], device: torch.device
) -> dict[str, torch.Tensor]:
    """Read and validate a HF safetensors directory into tensors on ``device`` in the served dtypes."""
    from safetensors.torch import load_file

    model_dir = Path(path).expanduser()
    if not model_dir.is_dir():
        raise InferenceError(f"{path}: not a directory")
    named: dict[str, torch.Tensor] = {}
    for file in _safetensors_files(model_dir):
        for name, tensor in load_file(str(file), device="cpu").items():
            if name in specs:
                named[name] = tensor
            else:
                logger.debug("ignoring %s from %s: not a weight of the served model", name, file.name)
    check_tensors(named, specs, required)
    return {n: t.to(device=device, dtype=specs[n][1]) for n, t in named.items()}


@dataclass
class WeightUpdateGroup:
    """This server's membership of one SGLang-style weight-update group."""

    name: str
    rank: int
    world_size: int
    backend: str
    device: torch.device
    process_group: Any

    def destroy(self, timeout_s: float | None = None) -> bool:
        """Leave the group; bounded, so a trainer that is gone cannot hang the server: after
        ``timeout_s`` (default ``GROUP_DESTROY_TIMEOUT_S``) the group is aborted locally. True when
        it was destroyed cleanly (see ``engine/weights/collective.py``, ``leave_process_group``)."""
        from areal_tasks.engine.weights.collective import GROUP_DESTROY_TIMEOUT_S, leave_process_group

        return leave_process_group(
            self.process_group, self.name, GROUP_DESTROY_TIMEOUT_S if timeout_s is None else timeout_s
        )


def init_weights_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    device: torch.device,
    timeout_s: float = 1800.0,
) -> WeightUpdateGroup:
    """Join the group as SGLang's ``init_custom_process_group`` does (blocks until every member joined)."""
    from areal_tasks.engine.weights.collective import init_custom_process_group

    if not group_name:
        raise InferenceError("group_name must not be empty")
    if backend not in ("gloo", "nccl"):
        raise InferenceError(f"backend must be gloo or nccl, got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise InferenceError("backend nccl needs the server to run on CUDA; use gloo on CPU")
    if not 0 < rank < world_size:
        raise InferenceError(f"rank {rank} must be in 1..{world_size - 1} (rank 0 is the trainer)")
    with on_device(device):
        pg = init_custom_process_group(
            backend, master_address, master_port, world_size, rank, group_name, timedelta(seconds=timeout_s)
        )
    logger.info("joined weight-update group %s as rank %d of %d (%s)", group_name, rank, world_size, backend)
    return WeightUpdateGroup(group_name, rank, world_size, backend, device, pg)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise InferenceError(f"unknown dtype {name!r}")
    return dtype


def _flat_bytes(names: list[str], types: list[torch.dtype], shapes: list[list[int]]) -> int:
    """Bytes of the tensors back to back; raises :class:`InferenceError` when one is unaligned."""
    if not len(names) == len(types) == len(shapes):
        raise InferenceError(f"names ({len(names)}), dtypes ({len(types)}) and shapes ({len(shapes)}) differ")
    total = 0
    for name, dtype, shape in zip(names, types, shapes):
        if total % dtype.itemsize:
            raise InferenceError(f"unaligned tensor {name}: byte offset {total}, dtype {dtype}")
        total += torch.Size(shape).numel() * dtype.itemsize
    return total


def split_flat(
    flat: torch.Tensor, names: list[str], types: list[torch.dtype], shapes: list[list[int]]
) -> dict[str, torch.Tensor]:
    """Views of the tensors lying back to back in the ``uint8`` tensor ``flat`` (no copy)."""
    if flat.numel() != _flat_bytes(names, types, shapes):
        raise InferenceError(
            f"the flat buffer holds {flat.numel()} bytes, the tensors listed need {_flat_bytes(names, types, shapes)}"
        )
    views, start = {}, 0
    for name, dtype, shape in zip(names, types, shapes):
        size = torch.Size(shape).numel() * dtype.itemsize
        views[name] = flat[start : start + size].view(dtype).reshape(shape)
        start += size
    return views


class SharedBufferReader:
    """This server's view of the trainer's shared weight buffer, opened on first use and kept until
    the trainer names another one (a new run, or a trainer that restarted). The views of one
    layout are made once: slicing 291 tensors anew cost more than the copy out of them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._opened: tuple[str, torch.Tensor] | None = None
        self._views: tuple[tuple, dict[str, torch.Tensor]] | None = None

    def read(
        self, descriptions: list[dict[str, Any]], names: list[str], dtypes: list[str], shapes: list[list[int]]
    ) -> tuple[dict[str, torch.Tensor], bool]:
        """Views of the listed tensors in the buffer on this server's device (no copy), and
        whether they are new (a buffer or layout not seen before: the caller validates those)."""
        from areal_tasks.engine.weights.shared import open_shared_buffer, pick_buffer
        from areal_tasks.errors import EngineError

        try:
            with on_device(self.device):
                description = pick_buffer(descriptions, self.device)
                buffer_id = str(description.get("id"))
                if self._opened is None or self._opened[0] != buffer_id:
                    self._opened = self._views = None  # drop the old mapping first
                    self._opened = (buffer_id, open_shared_buffer(description))
        except EngineError as exc:
            raise InferenceError(str(exc)) from exc
        key = (buffer_id, tuple(names), tuple(dtypes), tuple(tuple(shape) for shape in shapes))
        if self._views is not None and self._views[0] == key:
            return self._views[1], False
        views = split_flat(self._opened[1], names, [_dtype(d) for d in dtypes], shapes)
        self._views = (key, views)
        return views, True

    def forget_layout(self) -> None:
        """Validate the next read's views again (after they failed validation)."""
        self._views = None

    def close(self) -> None:
        self._opened = self._views = None


def receive_weights(
    group: WeightUpdateGroup, names: list[str], dtypes: list[str], shapes: list[list[int]], load_format: str | None
) -> dict[str, torch.Tensor]:
    """Receive one update from rank 0 of ``group`` (per-tensor broadcasts or one flattened bucket)."""
    if not len(names) == len(dtypes) == len(shapes):
        raise InferenceError(f"names ({len(names)}), dtypes ({len(dtypes)}) and shapes ({len(shapes)}) differ")
    types = [_dtype(d) for d in dtypes]
    with on_device(group.device):
        return _receive(group, names, types, shapes, load_format)


def _receive(
    group: WeightUpdateGroup,
    names: list[str],
    types: list[torch.dtype],
    shapes: list[list[int]],
    load_format: str | None,
) -> dict[str, torch.Tensor]:
    import torch.distributed as dist

    if load_format == "flattened_bucket":
        flat = torch.empty(_flat_bytes(names, types, shapes), dtype=torch.uint8, device=group.device)
        dist.broadcast(flat, src=0, group=group.process_group)
        received = split_flat(flat, names, types, shapes)
    elif load_format in (None, "auto"):
        received = {n: torch.empty(s, dtype=d, device=group.device) for n, d, s in zip(names, types, shapes)}
        handles = [dist.broadcast(t, src=0, group=group.process_group, async_op=True) for t in received.values()]
        for handle in handles:
            handle.wait()
    else:
        raise InferenceError(f"load_format {load_format!r} is not supported (use none or flattened_bucket)")
    if group.device.type == "cuda":
        torch.cuda.current_stream(group.device).synchronize()
    return received
