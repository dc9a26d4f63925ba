"""``Storage``: one interface over local/NFS paths, S3 and in-memory storage, rooted at a URL.

Every method takes a key relative to the root (``"ckpt/step_10/model.safetensors"``). Whole-object
operations are retried on transient errors (see :mod:`storage.retry`) and every backend failure is
raised as a :mod:`storage.errors` type. ``write_bytes``/``write_text`` and :meth:`Storage.atomic_write`
never leave a partial file visible: a temporary file renamed into place on a filesystem, a single
PUT or a completed multipart upload on S3. Directory commits live in :mod:`storage.commit`.
"""

from __future__ import annotations

import logging
import os
import posixpath
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import IO, Any, BinaryIO, TypeVar

import fsspec

from storage import atomic, commit
from storage.errors import StorageConfigError, StorageNotFoundError
from storage.options import resolve_options
from storage.retry import RetryPolicy
from storage.translate import translate_error
from storage.url import StorageURL, normalize_key, parse_url

__all__ = ["Storage", "open_storage"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Storage:
    """A storage location and the filesystem that reaches it. Build one with :meth:`from_url`."""

    def __init__(
        self,
        url: StorageURL,
        fs: fsspec.AbstractFileSystem,
        *,
        retry: RetryPolicy | None = None,
        describe: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.fs = fs
        self.retry = retry or RetryPolicy()
        self._describe = dict(describe or {})
        self._options = dict(options or {})

    @classmethod
    def from_url(
        cls,
        url: str | os.PathLike[str] | StorageURL,
        options: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
    ) -> Storage:
        """Storage for ``url`` (a path, ``file://``, ``s3://`` or ``memory://``) with ``options``.

        S3 settings missing from ``options`` are taken from ``env`` (default ``os.environ``); see
        :mod:`storage.options`. Raises StorageConfigError for a bad URL or option.
        """
        parsed = url if isinstance(url, StorageURL) else parse_url(url)
        resolved = resolve_options(parsed, options, env)
        if parsed.scheme == "s3":
            # imported here so that file:// users need neither s3fs nor botocore
            try:
                import s3fs
            except ImportError as exc:
                raise StorageConfigError(
                    f"{parsed} needs s3fs: pip install 's3fs[boto3]==2026.9.0' (the 'storage' extra)"
                ) from exc

            fs: fsspec.AbstractFileSystem = s3fs.S3FileSystem(**resolved.fs_kwargs)
            fs.retries = 1  # s3fs' own retry loop off: storage.retry is the one retry layer
        else:
            fs = fsspec.filesystem(resolved.protocol, **resolved.fs_kwargs)
        return cls(parsed, fs, retry=retry, describe=resolved.describe, options=options)

    # -- locations ------------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """``file``, ``s3`` or ``memory``."""
        return self.url.scheme

    @property
    def is_local(self) -> bool:
        """Whether keys map to paths on a mounted filesystem (local disk or NFS)."""
        return self.url.is_local

    @property
    def options(self) -> dict[str, Any]:
        """The options this storage was built with (may hold secrets: never log them)."""
        return dict(self._options)

    def describe(self) -> dict[str, Any]:
        """The URL and where endpoint, region and credentials came from, without any secret."""
        return {"url": str(self.url), "kind": self.kind, **self._describe}

    def fs_path(self, key: str = "") -> str:
        """The filesystem path of ``key`` (what ``self.fs`` methods take)."""
        return self.url.join(key).path

    def url_for(self, key: str = "") -> str:
        """The full URL of ``key``."""
        return str(self.url.join(key))

    def child(self, key: str) -> Storage:
        """A Storage rooted at ``key`` that shares this one's filesystem and settings."""
        return Storage(self.url.join(key), self.fs, retry=self.retry, describe=self._describe, options=self._options)

    def __repr__(self) -> str:
        return f"Storage({str(self.url)!r})"

    # -- queries --------------------------------------------------------------------------------

    def exists(self, key: str = "") -> bool:
        """Whether a file or directory (prefix, on S3) exists at ``key``."""
        path = self.fs_path(key)
        return self.run("check", key, lambda: bool(self.fs.exists(path)))

    def is_dir(self, key: str = "") -> bool:
        """Whether ``key`` is a directory (a non-empty prefix, on S3)."""
        path = self.fs_path(key)
        return self.run("check", key, lambda: bool(self.fs.isdir(path)))

    def size(self, key: str) -> int:
        """The size of the file at ``key`` in bytes."""
        path = self.fs_path(key)
        return int(self.run("stat", key, lambda: self.fs.size(path)))

    def list(self, key: str = "") -> list[str]:
        """Names of the entries directly under ``key`` (files and directories), sorted."""
        path = self.fs_path(key)
        entries = self.run("list", key, lambda: self.fs.ls(path, detail=False))
        names = {posixpath.basename(str(entry).rstrip("/")) for entry in entries}
        names.discard("")
        return sorted(names)

    def walk_files(self, key: str = "") -> dict[str, int]:
        """Every file below ``key``: its key relative to ``key`` -> its size in bytes."""
        path = self.fs_path(key)
        found = self.run("list", key, lambda: self.fs.find(path, detail=True))
        base = path.rstrip("/") + "/"
        out: dict[str, int] = {}
        for name, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = name[len(base) :] if name.startswith(base) else posixpath.basename(name)
            out[rel] = int(info.get("size") or 0)
        return dict(sorted(out.items()))

    # -- reads and writes -----------------------------------------------------------------------

    def read_bytes(self, key: str) -> bytes:
        """The whole content of the file at ``key``."""
        path = self.fs_path(key)
        return self.run("read", key, lambda: self.fs.cat_file(path))

    def read_text(self, key: str, encoding: str = "utf-8") -> str:
        """The content of the file at ``key``, decoded."""
        return self.read_bytes(key).decode(encoding)

    def write_bytes(self, key: str, data: bytes) -> None:
        """Write ``data`` to ``key`` atomically (readers see the old content or all of the new)."""
        if self.is_local:
            self.run("write", key, lambda: atomic.write_local(self.fs_path(key), data))
        else:
            path = self.fs_path(key)
            self.run("write", key, lambda: self.fs.pipe_file(path, data))

    def write_text(self, key: str, text: str, encoding: str = "utf-8") -> None:
        """Write ``text`` to ``key`` atomically."""
        self.write_bytes(key, text.encode(encoding))

    def atomic_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        """``with storage.atomic_write(key) as f: f.write(...)``: the file appears complete on success only.

        On an exception inside the block nothing is published and the temporary data is removed.
        """
        return atomic.atomic_writer(self, key)

    def open(self, key: str, mode: str = "rb") -> IO[Any]:
        """Open ``key`` as a stream. Writes through ``open`` are NOT atomic; prefer :meth:`atomic_write`."""
        path = self.fs_path(key)

        def open_it() -> IO[Any]:
            if any(flag in mode for flag in "wa") and self.is_local:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            return self.fs.open(path, mode)

        return self.run("open", key, open_it, retry=False)

    # -- mutations ------------------------------------------------------------------------------

    def makedirs(self, key: str = "") -> None:
        """Create the directory ``key`` and its parents. A no-op on S3 (prefixes need no creation;
        buckets are never created here)."""
        if self.kind == "s3":
            return
        path = self.fs_path(key)
        self.run("create directory", key, lambda: self.fs.makedirs(path, exist_ok=True))

    def delete(self, key: str, *, recursive: bool = False, missing_ok: bool = False) -> None:
        """Delete the file (or, with ``recursive``, the directory tree) at ``key``."""
        if not normalize_key(key):
            raise ValueError("refusing to delete the storage root; delete a key below it")
        path = self.fs_path(key)
        if self.kind == "s3" and not missing_ok and not self.exists(key):
            # S3 deletes are idempotent and never report a missing key; match the other backends
            raise StorageNotFoundError(f"delete {self.url_for(key)}: not found")
        markers = self._s3_directory_markers(key) if self.kind == "s3" and recursive else []
        try:
            self.run("delete", key, lambda: self.fs.rm(path, recursive=recursive))
        except StorageNotFoundError:
            if not missing_ok:
                raise
            logger.debug("delete %s: already gone", self.url_for(key))
        for marker in markers:  # deepest first: SeaweedFS keeps a non-empty directory
            bucket, _, marker_key = marker.partition("/")
            self.run("delete", key, lambda b=bucket, k=marker_key: self.fs.call_s3("delete_object", Bucket=b, Key=k))
        if markers:
            self.fs.invalidate_cache(path)

    def _s3_directory_markers(self, key: str) -> list[str]:
        """``bucket/prefix/`` of ``key`` and of every directory below it, deepest first.

        Some S3 servers (SeaweedFS; AWS when a console created the folder) hold a directory as an
        empty ``prefix/`` object, and keep listing the prefix after every object under it is gone;
        deleting these markers (a no-op where there is none) makes a deleted tree stop existing."""
        path = self.fs_path(key).rstrip("/")
        found = self.run("list", key, lambda: self.fs.find(path, withdirs=True, detail=True))
        dirs = {name.rstrip("/") for name, info in found.items() if info.get("type") == "directory"}
        dirs.add(path)
        return [f"{d}/" for d in sorted(dirs, key=lambda d: d.count("/"), reverse=True)]

    # -- directory commits (see storage.commit) ---------------------------------------------------

    def staged_directory(self, key: str, metadata: Mapping[str, Any] | None = None) -> AbstractContextManager[Storage]:
        """``with storage.staged_directory("step_10") as d: d.write_bytes(...)``: committed on success."""
        return commit.staged_directory(self, key, metadata)

    def commit_directory(self, key: str, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Mark the fully written directory ``key`` as committed (writes its marker last)."""
        return commit.commit_directory(self, key, metadata)

    def is_committed(self, key: str) -> bool:
        """Whether the directory ``key`` is committed."""
        return commit.is_committed(self, key)

    def list_committed(self, key: str = "") -> list[str]:
        """Names of the committed subdirectories of ``key``; uncommitted ones are invisible."""
        return commit.list_committed(self, key)

    # -- internals --------------------------------------------------------------------------------

    def run(self, what: str, key: str, fn: Callable[[], T], *, retry: bool = True) -> T:
        """Run ``fn`` (an operation on ``key``) with retries, raising storage errors on failure."""
        location = self.url_for(key)
        try:
            return self.retry.call(fn, f"{what} {location}") if retry else fn()
        except Exception as exc:
            translated = translate_error(exc, what, location)
            if translated is exc:
                raise
            raise translated from exc


def open_storage(url: str | os.PathLike[str], **options: Any) -> Storage:
    """Shorthand for ``Storage.from_url(url, options)``."""
    return Storage.from_url(url, options)
