"""Atomic writes: a reader sees the old content or all of the new, never a partial file or directory.

On a mounted filesystem the data goes to a hidden temporary file in the same directory, which is
flushed, fsynced and renamed over the target (``rename`` is atomic on POSIX filesystems, NFS
included); the directory is fsynced so the rename survives a crash. Object stores publish an object
only when its single PUT or multipart upload completes, so there the data is spooled to a local
temporary file and uploaded once, on success, with retries.

Local directories are published whole by :func:`atomic_directory` (staged beside the target,
renamed into place); what it may do to an existing target is the caller's explicit choice, and it
never deletes a file that a writer of ours did not write (:mod:`storage.ownership`).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from storage.errors import StorageError
from storage.ownership import MANIFEST, OnExists, check_target, inventory, manifest_text, tree_files

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
def atomic_directory(target: str | os.PathLike[str], *, on_exists: OnExists = "refuse") -> Iterator[Path]:
    """Yield an empty local staging directory; on success it becomes ``target`` in one rename.

    The staging directory is a hidden sibling of ``target`` (same filesystem, so the rename is
    atomic); its files are made world-readable and fsynced before the swap. On an exception the
    staging directory is removed and ``target`` is left as it was. A ``target`` the mode does not
    allow is refused (:class:`StorageError`) before the block runs, and again at publish time.

    ``on_exists`` says what happens to an existing ``target``; it never deletes a file that a writer
    of ours did not write (:mod:`storage.ownership`: every directory published in the first three
    modes lists its files in ``.areal-written.json``):

    * ``refuse`` (default): ``target`` must be absent or an empty directory.
    * ``replace_owned``: a ``target`` holding only files we wrote is replaced whole, in one swap
      (readers see the old directory or the new one); a foreign entry refuses.
    * ``merge_owned``: our files go into ``target``, files we wrote there before and not now are
      removed, foreign files stay; a foreign file where one of ours would go refuses. Without
      foreign files this is ``replace_owned``; with them the files are replaced one by one.
    * ``keep``: for content-addressed entries, where any complete copy is as good as another: if
      ``target`` exists when the staging directory is published (another process finished first),
      the staging directory is discarded and the existing ``target`` kept. No manifest.
    """
    check_target(target, on_exists)
    staging = staging_directory(target)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    publish_directory(staging, target, on_exists=on_exists)


def staging_directory(target: str | os.PathLike[str]) -> Path:
    """A new empty hidden sibling of ``target`` to build its content in (same filesystem as
    ``target``, so :func:`publish_directory` can rename it into place). For writers that span
    processes (each rank of a sharded checkpoint writes its part): one process makes it, all write,
    one publishes; :func:`atomic_directory` is the one-process form."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
    except OSError as exc:
        raise StorageError(f"cannot create a directory next to {target}: {exc}") from exc
    return staging


def publish_directory(
    staging: str | os.PathLike[str], target: str | os.PathLike[str], *, on_exists: OnExists = "refuse"
) -> None:
    """Make the complete ``staging`` directory ``target`` (files made world-readable and fsynced
    first); ``on_exists`` as in :func:`atomic_directory`. On any failure the staging directory is
    removed and ``target`` is left as it was (``merge_owned`` into a directory with foreign files:
    a failure midway leaves some of our files replaced, all of them listed as ours)."""
    staging, target = Path(staging), Path(target)
    try:
        check_target(target, on_exists)
        if on_exists != "keep":
            (staging / MANIFEST).write_text(manifest_text(tree_files(staging), _WRITER), encoding="utf-8")
        _make_readable(staging)
        _fsync_tree(staging)
        if on_exists == "keep":
            _publish_unless_present(staging, target)
            return
        if on_exists == "refuse" or not _non_empty(target):
            _publish_new(staging, target)
        elif on_exists == "replace_owned" or not inventory(target).foreign:
            _swap_owned(staging, target)
        else:
            _merge_owned(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, StorageError):
            raise StorageError(f"cannot publish {target}: {exc}") from exc
        raise
    logger.info("wrote %s", target)


_WRITER = "storage.atomic.atomic_directory"


def _non_empty(path: Path) -> bool:
    return path.is_dir() and any(path.iterdir())


def _publish_new(staging: Path, target: Path) -> None:
    """Rename ``staging`` to an absent or empty ``target``."""
    try:
        os.rename(staging, target)
    except OSError as exc:
        raise StorageError(f"cannot publish {target} (did it appear meanwhile?): {exc}") from exc
    _fsync_dir(target.parent)


def _swap_owned(staging: Path, target: Path) -> None:
    """Replace ``target``, which holds only files we wrote, by ``staging`` (the old copy is set aside
    under a hidden name, checked again there, and removed after the swap; put back on failure)."""
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(target, old)
    try:
        found = inventory(old)
        if found.foreign:
            raise StorageError(
                f"{target} gained files this writer did not write ({found.describe_foreign()}); refusing to replace it"
            )
        os.rename(staging, target)
    except BaseException:
        os.rename(old, target)
        raise
    _fsync_dir(target.parent)
    try:
        shutil.rmtree(old)
    except OSError as exc:
        raise StorageError(f"published {target}, but could not remove its previous copy {old}: {exc}") from exc


def _merge_owned(staging: Path, target: Path) -> None:
    """Move our files into ``target`` one by one, keeping its foreign files (see :func:`atomic_directory`)."""
    found = inventory(target)
    ours = tree_files(staging)
    collisions = [rel for rel in ours if _collides(target, rel, found.owned)]
    if collisions:
        shown = ", ".join(collisions[:5]) + (f" and {len(collisions) - 5} more" if len(collisions) > 5 else "")
        raise StorageError(
            f"{target} holds files this writer did not write where it would write its own ({shown}); "
            "refusing to overwrite them"
        )
    # claim every name first: a failure midway leaves each file we touch listed as ours
    _write_manifest(target, found.owned | set(ours))
    for rel in ours:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, target / rel)
    for rel in sorted(found.owned - set(ours)):
        (target / rel).unlink()
        for parent in Path(rel).parents:  # directories that held only files we wrote go with them
            if parent != Path(".") and not any((target / parent).iterdir()):
                (target / parent).rmdir()
    _write_manifest(target, ours)
    shutil.rmtree(staging)
    logger.info("kept %d files of %s that this writer did not write", len(found.foreign), target)


def _write_manifest(directory: Path, files: Iterable[str]) -> None:
    write_local_text(directory / MANIFEST, manifest_text(files, _WRITER))
    os.chmod(directory / MANIFEST, 0o644)


def _collides(target: Path, rel: str, owned: frozenset[str]) -> bool:
    """Whether writing ``rel`` into ``target`` would replace a foreign entry or go through a link or file."""
    parts = Path(rel).parts
    for depth in range(1, len(parts)):
        prefix = target.joinpath(*parts[:depth])
        if prefix.is_symlink() or (os.path.lexists(prefix) and not prefix.is_dir()):
            return True
    path = target / rel
    return os.path.lexists(path) and rel not in owned


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
