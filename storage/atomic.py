"""Atomic writes: a reader sees the old content or all of the new, never a partial file or directory.

On a mounted filesystem the data goes to a hidden temporary file in the same directory, which is
flushed, fsynced and renamed over the target (``rename`` is atomic on POSIX filesystems, NFS
included); the directory is fsynced so the rename survives a crash. Object stores publish an object
only when its single PUT or multipart upload completes, so there the data is spooled to a local
temporary file and uploaded once, on success, with retries.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from storage.storage import Storage

__all__ = [
    "TEMP_PREFIX",
    "UPLOAD_PART_BYTES",
    "atomic_directory",
    "atomic_writer",
    "publish_directory",
    "staging_directory",
    "write_local",
    "write_local_text",
]

logger = logging.getLogger(__name__)

#: temporary files start with this, so listings and cleanup can recognise them.
TEMP_PREFIX = ".tmp-"
#: S3 part size: an object of at least two parts is uploaded in parts (minimum 5 MiB).
UPLOAD_PART_BYTES = 50 * 2**20
MAX_UPLOAD_PARTS = 10_000


def _temp_path(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f"{TEMP_PREFIX}{name}.{uuid.uuid4().hex[:12]}")


def _fsync_dir(directory: str | os.PathLike[str]) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(temp: str) -> None:
    try:
        os.unlink(temp)
    except FileNotFoundError:
        logger.debug("temporary file %s was already removed", temp)


def _open_temp(path: str, temp: str) -> BinaryIO:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return open(temp, "wb")


def _publish(handle: BinaryIO, temp: str, path: str) -> None:
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    os.replace(temp, path)
    _fsync_dir(os.path.dirname(path))


def write_local(path: str, data: bytes) -> None:
    """Write ``data`` to the local ``path`` atomically and durably (temp file, fsync, rename)."""
    temp = _temp_path(path)
    handle = _open_temp(path, temp)
    try:
        with handle:
            handle.write(data)
            _publish(handle, temp, path)
    except BaseException:
        _discard(temp)
        raise


def write_local_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to the local ``path`` atomically and durably."""
    write_local(os.fspath(path), text.encode("utf-8"))


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(dirpath)


def _make_readable(root: Path) -> None:
    """World-readable files and directories: readers may run as another user (writers such as
    safetensors create files 0600)."""
    os.chmod(root, 0o755)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


@contextmanager
def atomic_directory(target: str | os.PathLike[str], *, replace: bool = True) -> Iterator[Path]:
    """Yield an empty local staging directory; on success it becomes ``target`` in one rename.

    The staging directory is a hidden sibling of ``target`` (same filesystem, so the rename is
    atomic); its files are made world-readable and fsynced before the swap. On an exception the
    staging directory is removed and ``target`` is left as it was.

    ``replace=True``: an existing ``target`` is moved aside first and removed after the swap (the
    new content wins). ``replace=False`` is for content-addressed entries, where any complete copy
    is as good as another: if ``target`` exists when the staging directory is published (another
    process finished first), the staging directory is discarded and the existing ``target`` kept.
    """
    staging = staging_directory(target)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    publish_directory(staging, target, replace=replace)


def staging_directory(target: str | os.PathLike[str]) -> Path:
    """A new empty hidden sibling of ``target`` to build its content in (same filesystem as
    ``target``, so :func:`publish_directory` can rename it into place). For writers that span
    processes (each rank of a sharded checkpoint writes its part): one process makes it, all write,
    one publishes; :func:`atomic_directory` is the one-process form."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def publish_directory(staging: str | os.PathLike[str], target: str | os.PathLike[str], *, replace: bool = True) -> None:
    """Make the complete ``staging`` directory ``target`` in one rename (files made world-readable
    and fsynced first); ``replace`` as in :func:`atomic_directory`. On a failure before the rename
    the staging directory is removed and ``target`` is left as it was."""
    staging, target = Path(staging), Path(target)
    try:
        _make_readable(staging)
        _fsync_tree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not replace:
        _publish_unless_present(staging, target)
        return
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(target, old)
    os.rename(staging, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old)
    logger.info("wrote %s", target)


def _publish_unless_present(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; if a non-empty ``target`` appeared meanwhile, keep it and drop ours."""
    try:
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():
            raise
        logger.debug("another process published %s first; keeping theirs", target)
        return
    _fsync_dir(target.parent)
    logger.info("wrote %s", target)


@contextmanager
def atomic_writer(storage: Storage, key: str) -> Iterator[BinaryIO]:
    """Yield a binary file; on a clean exit its content is published at ``key`` in one step.

    Storage failures (opening, syncing, renaming, uploading) raise storage errors; an exception
    raised inside the ``with`` block propagates unchanged after the temporary data is removed.
    """
    if storage.is_local:
        path = storage.fs_path(key)
        temp = _temp_path(path)
        handle = storage.run("write", key, lambda: _open_temp(path, temp), retry=False)
        try:
            with handle:
                yield handle
                storage.run("write", key, lambda: _publish(handle, temp, path), retry=False)
        except BaseException:
            _discard(temp)
            raise
        return
    with tempfile.NamedTemporaryFile(prefix="areal-upload-", suffix=".part") as spool:
        yield spool  # type: ignore[misc]
        spool.flush()
        remote = storage.fs_path(key)
        kwargs = {}
        if storage.kind == "s3":
            size = os.path.getsize(spool.name)
            kwargs["chunksize"] = max(UPLOAD_PART_BYTES, math.ceil(size / MAX_UPLOAD_PARTS))
        storage.run("upload", key, lambda: storage.fs.put_file(spool.name, remote, **kwargs))
