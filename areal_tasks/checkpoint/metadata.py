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

from areal_tasks.errors import CheckpointError, CheckpointIntegrityError

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
    def from_dict(cls, data: Mapping[str, Any], source: str = "checkpoint metadata") -> CheckpointMetadata:
        """Metadata from parsed JSON; ``source`` (the file's URL) names it in errors. An unsupported
        format is a :class:`CheckpointError`; a damaged layout a :class:`CheckpointIntegrityError`."""
        if not isinstance(data, Mapping):
            raise damaged(source, f"must hold a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != FORMAT_VERSION:
            raise CheckpointError(f"{source}: metadata format {fmt!r} is not supported (expected {FORMAT_VERSION})")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        unknown = sorted(set(data) - known)
        if unknown:
            logger.debug("ignoring unknown metadata fields %s", unknown)
        try:
            _check_layout(data)
            values["sizes"] = ByteCounts(**data.get("sizes", {}))
            values["files"] = {name: FileInfo(**info) for name, info in data.get("files", {}).items()}
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise damaged(source, f"has an unexpected layout: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "checkpoint metadata") -> CheckpointMetadata:
        return cls.from_dict(load_json(text, source), source)

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


#: the largest ``metadata.json`` (or marker file) read: real ones are kilobytes, a bigger one is damage.
MAX_METADATA_BYTES = 16 * 2**20

_TYPES: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "epoch": (int,),
    "version": (int,),
    "world_size": (int,),
    "created_at": (str,),
    "completed_at": (str,),
    "timings": (dict,),
    "metrics": (dict,),
    "parent": (int, type(None)),
    "incremental": (bool,),
    "engines": (dict,),
    "references": (dict,),
    "sizes": (dict,),
    "files": (dict,),
}


def _check_layout(data: Mapping[str, Any]) -> None:
    """Raise ValueError for a field of the wrong JSON type (what ``list`` and pruning rely on)."""
    for key, types in _TYPES.items():
        if key in data and (not isinstance(data[key], types) or (bool not in types and isinstance(data[key], bool))):
            raise ValueError(f"{key!r} is a {type(data[key]).__name__}")
    for name, value in data.get("metrics", {}).items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"metric {name!r} is a {type(value).__name__}, not a number")
    for directory, files in data.get("references", {}).items():
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError(f"references of {directory!r} are not a list of file names")
    for name, info in data.get("files", {}).items():
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("size"), int)
            or not isinstance(info.get("sha256"), str)
        ):
            raise ValueError(f"file entry {name!r} is not {{size: int, sha256: str}}")


def damaged(file: str, what: str, item: str | None = None) -> CheckpointIntegrityError:
    """The error for damage found in ``file`` (a URL), at ``item`` (a DCP item's name) when known."""
    exc = CheckpointIntegrityError(f"{file}: item {item!r} {what}" if item else f"{file} {what}")
    exc.file, exc.item = file, item
    return exc


def load_json(data: str | bytes, source: str) -> Any:
    """Parse the JSON ``data`` of ``source`` (a file's URL); undecodable, malformed or too deeply
    nested JSON is a :class:`CheckpointIntegrityError` naming ``source``."""
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise damaged(source, "is not valid JSON: nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise damaged(source, f"is not valid JSON: {exc}") from exc


def check_bytes(data: bytes, expected: FileInfo, url: str) -> None:
    """Raise :class:`CheckpointIntegrityError` when ``data`` (the bytes of ``url``) differ from what
    ``metadata.json`` recorded for the file."""
    if len(data) != expected.size:
        raise damaged(url, f"holds {len(data)} bytes; metadata.json records {expected.size}")
    digest = sha256_hex(data)
    if digest != expected.sha256:
        raise damaged(
            url, f"fails its sha256 check (got {digest[:12]}..., metadata.json records {expected.sha256[:12]}...)"
        )


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
