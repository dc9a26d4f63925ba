"""``metadata.json`` of a checkpoint: what it is (step, epoch, version, config, metrics), where it came
from (parent, times) and what it is made of (files with sizes and hashes, references, byte counts).

Hashes: JSON files carry the sha256 of their bytes. A DCP data file carries ``sha256`` over the
sha256 digests of its items in file order (each item's own hash is in ``dcp/index.json``), so
verifying a file never needs a second pass over the data at save time. ``references`` names the
files of *other* step directories whose bytes this checkpoint reuses (incremental saves): pruning
keeps them. Torch-free.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_tasks.errors import CheckpointError

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class FileInfo:
    """One file of a checkpoint: size in bytes and hash (see the module docstring for data files)."""

    size: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class ByteCounts:
    """How big a checkpoint is. ``logical``: bytes of every item it holds; ``written``: bytes this save
    wrote (data and side files); ``referenced``: item bytes reused from earlier checkpoints."""

    logical: int = 0
    written: int = 0
    referenced: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass
class CheckpointMetadata:
    """Everything ``metadata.json`` records about one checkpoint."""

    step: int
    epoch: int = 0
    version: int = 0
    world_size: int = 1
    created_at: str = ""
    completed_at: str = ""
    #: seconds spent: ``stage`` (blocking the trainer), ``write`` (data upload), ``total``.
    timings: dict[str, float] = field(default_factory=dict)
    config_hash: str | None = None
    config: dict[str, Any] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    #: step of the checkpoint this one was diffed against (incremental saves), or None.
    parent: int | None = None
    incremental: bool = False
    #: engine name -> {"role", "lora", "tied_embeddings", "model_type", "version"}.
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: step directory name -> files of it whose bytes this checkpoint reads.
    references: dict[str, list[str]] = field(default_factory=dict)
    sizes: ByteCounts = field(default_factory=ByteCounts)
    #: every file of this checkpoint except ``metadata.json`` and ``_COMPLETE``.
    files: dict[str, FileInfo] = field(default_factory=dict)
    format: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["sizes"] = self.sizes.to_dict()
        out["files"] = {name: info.to_dict() for name, info in sorted(self.files.items())}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, allow_nan=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckpointMetadata:
        if not isinstance(data, Mapping):
            raise CheckpointError(f"checkpoint metadata must be a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint metadata format {fmt!r} is not supported (expected {FORMAT_VERSION})")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        unknown = sorted(set(data) - known)
        if unknown:
            logger.debug("ignoring unknown metadata fields %s", unknown)
        try:
            values["sizes"] = ByteCounts(**data.get("sizes", {}))
            values["files"] = {name: FileInfo(**info) for name, info in data.get("files", {}).items()}
            return cls(**values)
        except TypeError as exc:
            raise CheckpointError(f"checkpoint metadata has an unexpected layout: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> CheckpointMetadata:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"checkpoint metadata is not valid JSON: {exc}") from exc
        return cls.from_dict(data)

    def summary(self) -> dict[str, Any]:
        """The short form ``list`` shows: step, epoch, version, times, metrics, sizes, parent."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "version": self.version,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "metrics": dict(self.metrics),
            "parent": self.parent,
            "bytes_logical": self.sizes.logical,
            "bytes_written": self.sizes.written,
            "bytes_referenced": self.sizes.referenced,
        }


def json_file(payload: Any) -> tuple[bytes, FileInfo]:
    """``payload`` as canonical JSON bytes and their FileInfo."""
    data = json.dumps(payload, indent=1, sort_keys=True, allow_nan=True).encode("utf-8")
    return data, FileInfo(size=len(data), sha256=sha256_hex(data))


def config_payload(config: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(resolved config as plain data, its hash) of a JobConfig, a mapping or None.

    A JobConfig uses :func:`areal_tasks.config.serialize.config_hash`, so the hash matches the one
    written next to the resolved ``config.yaml`` of the run.
    """
    if config is None:
        return None, None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        from areal_tasks.config.job import JobConfig
        from areal_tasks.config.serialize import config_hash, config_to_dict

        if isinstance(config, JobConfig):
            return config_to_dict(config), config_hash(config)
        data = dataclasses.asdict(config)
    elif isinstance(config, Mapping):
        data = dict(config)
    else:
        raise CheckpointError(f"config must be a JobConfig, a dataclass or a mapping, got {type(config).__name__}")
    try:
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except TypeError as exc:
        raise CheckpointError(f"the config to record in the checkpoint is not JSON-serialisable: {exc}") from exc
    return json.loads(canonical), sha256_hex(canonical.encode("utf-8"))[:12]
