"""Atomic file writes: a reader sees the old content or all of the new, never a partial file.

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
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    from storage.storage import Storage

__all__ = ["TEMP_PREFIX", "UPLOAD_PART_BYTES", "atomic_writer", "write_local"]

logger = logging.getLogger(__name__)

#: temporary files start with this, so listings and cleanup can recognise them.
TEMP_PREFIX = ".tmp-"
#: S3 part size: an object of at least two parts is uploaded in parts (minimum 5 MiB).
UPLOAD_PART_BYTES = 50 * 2**20
MAX_UPLOAD_PARTS = 10_000


def _temp_path(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f"{TEMP_PREFIX}{name}.{uuid.uuid4().hex[:12]}")


def _fsync_dir(directory: str) -> None:
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
