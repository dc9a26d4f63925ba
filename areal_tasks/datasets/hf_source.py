"""Data files through Hugging Face ``datasets``: parquet, JSON/JSONL, Arrow and ``save_to_disk`` directories.

:func:`locate` resolves a ``dataset.path`` (a local path, ``file://`` or ``s3://`` URL; a single file,
a glob such as ``s3://bucket/gsm8k/train-*.parquet``, a directory of shards, or a directory written
by ``Dataset.save_to_disk``) to a :class:`DataLocation`, using the :mod:`storage` package's
filesystem and options, so ``s3://`` takes the same endpoint, region and credentials (options first,
then the AWS environment) as checkpoints do. :func:`open_dataset` loads it with ``datasets``: a
memory-mapped ``datasets.Dataset``, or with ``streaming=True`` an ``IterableDataset`` that reads
the files as it goes and never holds the whole set.

Every failure a user can cause (a missing file, an unknown format, a corrupt file, an empty set, a
``save_to_disk`` directory of several splits) is a :class:`~areal_tasks.errors.ConfigError` naming
the path and the fix. ``datasets`` is imported inside the functions that load (it is heavy); this
module imports without it.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["FORMATS", "DataLocation", "locate", "open_dataset"]

#: file suffix -> the ``datasets`` builder that reads it.
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
#: a ``save_to_disk`` directory holds these files (one split) or ``dataset_dict.json`` (several).
_SAVED_SPLIT = ("dataset_info.json", "state.json")
_SAVED_DICT = "dataset_dict.json"
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class DataLocation:
    """Where a data set is and how to read it.

    ``kind``: ``files`` (data files read by the ``builder``) or ``saved`` (a ``save_to_disk``
    directory at ``files[0]``); ``files``: URLs (``s3://...``) or local paths; ``storage_options``:
    what ``datasets`` hands fsspec, keyed by protocol.
    """

    spec: str
    kind: Literal["files", "saved"]
    builder: str | None
    files: tuple[str, ...]
    storage_options: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)


def _suffix(path: str) -> str:
    name = posixpath.basename(path.rstrip("/"))
    return os.path.splitext(name)[1].lower()


def _supported() -> str:
    return ", ".join(FORMATS) + " files, a glob or directory of them, or a save_to_disk directory"


def locate(spec: str, options: Mapping[str, Any] | None = None) -> DataLocation:
    """The data ``spec`` names (see the module docstring); ConfigError when there is none or it is unreadable."""
    from storage import StorageError
    from storage.options import resolve_options
    from storage.storage import Storage
    from storage.url import parse_url

    try:
        url = parse_url(spec)
        storage = Storage.from_url(url, options)
        fs_kwargs = resolve_options(url, options).fs_kwargs
    except StorageError as exc:
        raise ConfigError(f"dataset path {spec!r}: {exc}") from exc
    fs, path = storage.fs, url.path
    prefix = "s3://" if url.scheme == "s3" else ""
    storage_options = {"s3": fs_kwargs} if url.scheme == "s3" else {}

    def located(kind: Literal["files", "saved"], builder: str | None, paths: list[str]) -> DataLocation:
        return DataLocation(spec, kind, builder, tuple(prefix + p for p in paths), storage_options)

    try:
        if _GLOB_CHARS & set(path):
            matches = sorted(p for p in fs.glob(path) if fs.isfile(p))
            if not matches:
                raise ConfigError(f"dataset path {spec!r}: the pattern matches no file")
            return located("files", _one_builder(spec, matches), matches)
        if fs.isfile(path):
            return located("files", _one_builder(spec, [path]), [path])
        if fs.isdir(path):
            return _directory(spec, fs, path, located)
    except OSError as exc:
        raise ConfigError(f"dataset path {spec!r} cannot be read: {type(exc).__name__}: {exc}") from exc
    raise ConfigError(f"dataset path {spec!r} does not exist (expected {_supported()}, or demo:<name>)")


def _directory(spec: str, fs: Any, path: str, located: Any) -> DataLocation:
    names = {posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)}
    if _SAVED_DICT in names:
        splits = sorted(n for n in names if fs.isdir(posixpath.join(path, n)))
        raise ConfigError(
            f"dataset path {spec!r} is a save_to_disk directory of several splits {splits}; "
            f"point the path at one of them, e.g. {spec.rstrip('/')}/{splits[0] if splits else 'train'}"
        )
    if all(n in names for n in _SAVED_SPLIT):
        return located("saved", None, [path])
    shards = sorted(p for p in fs.find(path) if _suffix(p) in FORMATS and not posixpath.basename(p).startswith("."))
    if not shards:
        raise ConfigError(f"dataset path {spec!r} is a directory without data files (expected {_supported()})")
    return located("files", _one_builder(spec, shards), shards)


def _one_builder(spec: str, paths: list[str]) -> str:
    suffixes = sorted({_suffix(p) for p in paths})
    unknown = [s or "(none)" for s in suffixes if s not in FORMATS]
    if unknown:
        raise ConfigError(
            f"dataset path {spec!r}: unsupported format {', '.join(unknown)}; supported: {_supported()} "
            "(convert other formats with datasets' Dataset.to_parquet)"
        )
    builders = sorted({FORMATS[s] for s in suffixes})
    if len(builders) > 1:
        raise ConfigError(f"dataset path {spec!r} mixes formats ({', '.join(suffixes)}); keep one format per set")
    return builders[0]


def open_dataset(location: DataLocation, *, streaming: bool = False) -> Any:
    """A ``datasets.Dataset`` (or with ``streaming`` an ``IterableDataset``) of ``location``."""
    import datasets

    spec = location.spec
    try:
        if location.kind == "saved":
            ds = datasets.load_from_disk(location.files[0], storage_options=location.storage_options.get("s3"))
            if isinstance(ds, datasets.DatasetDict):  # pragma: no cover - locate() refuses these
                raise ConfigError(f"dataset path {spec!r} holds several splits; name one")
            return ds.to_iterable_dataset() if streaming else ds
        return datasets.load_dataset(
            location.builder,
            data_files=list(location.files),
            split="train",
            streaming=streaming,
            storage_options=location.storage_options or None,
        )
    except ConfigError:
        raise
    except StopIteration as exc:  # datasets' JSON reader on files without a single row
        raise ConfigError(f"dataset path {spec!r} holds no records") from exc
    except (datasets.exceptions.DatasetGenerationError, ValueError, OSError, TypeError) as exc:
        raise _unreadable(location, exc) from exc
    except Exception as exc:
        if type(exc).__module__.startswith("pyarrow"):
            raise _unreadable(location, exc) from exc
        raise


def _parquet_rows(location: DataLocation) -> int | None:
    """Rows in ``location``'s parquet files by their footers (None when they cannot be read)."""
    import fsspec
    import pyarrow.parquet as pq

    total = 0
    for path in location.files:
        try:
            with fsspec.open(path, "rb", **location.storage_options.get("s3", {})) as handle:
                total += pq.read_metadata(handle).num_rows
        except (OSError, ValueError):
            return None
        except Exception as exc:
            if type(exc).__module__.startswith("pyarrow"):
                return None
            raise
    return total


def _unreadable(location: DataLocation, exc: BaseException) -> ConfigError:
    spec = location.spec
    if location.builder == "parquet" and _parquet_rows(location) == 0:
        return ConfigError(f"dataset path {spec!r} holds no records")
    cause = exc.__cause__ or exc.__context__ or exc
    detail = f"{type(cause).__name__}: {cause}" if cause is not exc else f"{type(exc).__name__}: {exc}"
    return ConfigError(
        f"dataset path {spec!r} cannot be read as data ({detail[:300]}); check that the file is complete and "
        f"in the format its name says ({_supported()})"
    )
