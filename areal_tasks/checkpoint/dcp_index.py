"""``dcp/index.json``: torch DCP ``Metadata`` as JSON, plus one record per stored item.

DCP's own ``.metadata`` file is a pickle; here the same content (tensor sizes, dtypes, the chunk
of every shard, the planner's flattening map) is JSON, so a checkpoint can be inspected, diffed and
loaded without unpickling data from shared storage. Each item record says where its bytes are --
a step directory (this one, or an earlier one for an item an incremental save reused), a file,
an offset and a length -- and carries the sha256 of those bytes. Tensors are stored raw
(contiguous, native byte order), so the hash is a pure content hash; other objects are stored as
DCP serialises them (``torch.save`` bytes).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.checkpoint.layout import parse_step_dir
from areal_tasks.checkpoint.metadata import damaged
from areal_tasks.errors import CheckpointError

if TYPE_CHECKING:
    import torch
    from torch.distributed.checkpoint.metadata import Metadata

logger = logging.getLogger(__name__)

INDEX_FORMAT = 1

ItemKey = tuple[str, tuple[int, ...] | None]


@dataclass(frozen=True)
class ItemRecord:
    """Where one DCP item (a tensor shard or a serialised object) is stored, and its content hash."""

    fqn: str
    #: the shard's offset in the full tensor; None for non-tensor items.
    offset: tuple[int, ...] | None
    kind: str  # "tensor" | "bytes"
    #: the step directory holding the bytes (relative to the checkpoints folder).
    dir: str
    file: str
    pos: int
    length: int
    sha256: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None

    @property
    def key(self) -> ItemKey:
        return (self.fqn, self.offset)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fqn": self.fqn,
            "offset": None if self.offset is None else list(self.offset),
            "kind": self.kind,
            "dir": self.dir,
            "file": self.file,
            "pos": self.pos,
            "length": self.length,
            "sha256": self.sha256,
            "dtype": self.dtype,
            "shape": None if self.shape is None else list(self.shape),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ItemRecord:
        offset, shape = data.get("offset"), data.get("shape")
        return cls(
            fqn=data["fqn"],
            offset=None if offset is None else tuple(offset),
            kind=data["kind"],
            dir=data["dir"],
            file=data["file"],
            pos=int(data["pos"]),
            length=int(data["length"]),
            sha256=data["sha256"],
            dtype=data.get("dtype"),
            shape=None if shape is None else tuple(shape),
        )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown tensor dtype {name!r} in a checkpoint index")
    return dtype


def _tensor_meta_to_json(meta: Any) -> dict[str, Any]:
    return {
        "type": "tensor",
        "dtype": dtype_name(meta.properties.dtype),
        "requires_grad": bool(meta.properties.requires_grad),
        "size": list(meta.size),
        "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in meta.chunks],
    }


def _planner_data_to_json(planner_data: Any) -> dict[str, list[Any]] | None:
    if planner_data is None:
        return None
    return {fqn: list(path) for fqn, path in planner_data.items()}


def index_to_json(metadata: Metadata, records: list[ItemRecord]) -> dict[str, Any]:
    """The JSON form of DCP ``metadata`` (its storage data being ``records``)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    entries: dict[str, Any] = {}
    for fqn, meta in metadata.state_dict_metadata.items():
        if isinstance(meta, TensorStorageMetadata):
            entries[fqn] = _tensor_meta_to_json(meta)
        elif isinstance(meta, BytesStorageMetadata):
            entries[fqn] = {"type": "bytes"}
        else:
            raise CheckpointError(f"unsupported DCP storage metadata {type(meta).__name__} for {fqn!r}")
    return {
        "format": INDEX_FORMAT,
        "dcp_version": metadata.version,
        "state_dict": entries,
        "planner_data": _planner_data_to_json(metadata.planner_data),
        "items": [r.to_dict() for r in sorted(records, key=lambda r: (r.fqn, r.offset or ()))],
    }


def records_of(index: dict[str, Any]) -> list[ItemRecord]:
    _check_format(index)
    return [ItemRecord.from_dict(item) for item in index["items"]]


_TOP_KEYS = ("format", "state_dict", "items")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_TENSOR_KEYS = {"dtype": str, "requires_grad": bool, "size": list, "chunks": list}
_ITEM_KEYS = {"fqn": str, "kind": str, "dir": str, "file": str, "pos": int, "length": int, "sha256": str}


def validate_index(index: Any, source: str) -> None:
    """Check the layout of a parsed ``dcp/index.json`` (``source``: its URL, named in errors): the keys
    and JSON types the loader reads, and that every record points inside the checkpoints folder.
    A damaged index is a :class:`CheckpointIntegrityError`; an unknown format a :class:`CheckpointError`."""
    if not isinstance(index, dict):
        raise damaged(source, f"must hold a JSON object, got {type(index).__name__}")
    missing = [key for key in _TOP_KEYS if key not in index]
    if missing:
        raise damaged(source, f"lacks the keys {missing}")
    _check_format(index)
    entries, items = index["state_dict"], index["items"]
    if not isinstance(entries, dict) or not isinstance(items, list):
        raise damaged(source, "has a 'state_dict' that is not an object or 'items' that are not a list")
    for fqn, entry in entries.items():
        if not isinstance(entry, dict) or entry.get("type") not in ("tensor", "bytes"):
            raise damaged(source, f"has a state_dict entry {fqn!r} of no type 'tensor' or 'bytes'")
        if entry["type"] == "tensor":
            _check_keys(entry, _TENSOR_KEYS, source, f"state_dict entry {fqn!r}")
            for chunk in entry["chunks"]:
                if not isinstance(chunk, dict) or not {"offsets", "sizes"} <= set(chunk):
                    raise damaged(source, f"has a chunk of {fqn!r} without 'offsets' or 'sizes'")
    for number, item in enumerate(items):
        if not isinstance(item, dict):
            raise damaged(source, f"has an item record {number} that is not an object")
        _check_keys(item, _ITEM_KEYS, source, f"item record {number} ({item.get('fqn', '?')!r})")
        if not _SHA256.fullmatch(item["sha256"]):
            raise damaged(source, f"has an item record {item['fqn']!r} whose sha256 is not 64 hex digits")
        if not _inside(item["dir"], item["file"]):
            raise damaged(
                source,
                f"has an item record {item['fqn']!r} outside the checkpoints folder: {item['dir']}/{item['file']}",
            )


def _check_keys(data: dict[str, Any], keys: dict[str, type], source: str, what: str) -> None:
    missing = sorted(key for key in keys if key not in data)
    if missing:
        raise damaged(source, f"has a {what} that lacks the keys {missing}")
    wrong = sorted(
        key
        for key, kind in keys.items()
        if not isinstance(data[key], kind) or (kind is int and isinstance(data[key], bool))
    )
    if wrong:
        raise damaged(source, f"has a {what} with values of the wrong type for {wrong}")


def _inside(directory: str, file: str) -> bool:
    """Whether a record's ``dir``/``file`` name a file of a step directory (no absolute path, no ``..``)."""
    parts = file.split("/")
    return parse_step_dir(directory) is not None and not file.startswith("/") and ".." not in parts and "" not in parts


def _check_format(index: dict[str, Any]) -> None:
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        fmt = index.get("format") if isinstance(index, dict) else None
        raise CheckpointError(f"DCP index format {fmt!r} is not supported (expected {INDEX_FORMAT})")


def metadata_from_json(index: dict[str, Any]) -> Metadata:
    """DCP ``Metadata`` whose ``storage_data`` maps ``MetadataIndex`` -> :class:`ItemRecord`."""
    import torch
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    _check_format(index)
    state: dict[str, Any] = {}
    for fqn, entry in index["state_dict"].items():
        if entry["type"] == "bytes":
            state[fqn] = BytesStorageMetadata()
            continue
        chunks = [
            ChunkStorageMetadata(offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"]))
            for c in entry["chunks"]
        ]
        props = TensorProperties(dtype=dtype_of(entry["dtype"]), requires_grad=entry["requires_grad"])
        state[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(entry["size"]), chunks=chunks)
    storage = {MetadataIndex(r.fqn, r.offset): r for r in records_of(index)}
    planner = index.get("planner_data")
    planner_data = None if planner is None else {fqn: tuple(path) for fqn, path in planner.items()}
    return Metadata(
        state_dict_metadata=state, planner_data=planner_data, storage_data=storage, version=index.get("dcp_version")
    )
