"""Copy a directory tree between any two storages (local -> S3, S3 -> local, ...) with a progress bar.

Each file is streamed in chunks into an atomic writer, so a copy interrupted midway never leaves a
truncated file at the destination; a file whose copy fails with a transient error is copied again
from its start (see :mod:`storage.retry`). With ``commit=True`` the destination directory gets a
commit marker once every file is there (see :mod:`storage.commit`).
"""

from __future__ import annotations

import logging
import posixpath
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from storage.commit import COMMIT_MARKER, commit_directory
from storage.errors import StorageNotFoundError
from storage.url import normalize_key

if TYPE_CHECKING:
    from tqdm import tqdm

    from storage.storage import Storage

__all__ = ["CHUNK_BYTES", "CopyStats", "copy_tree"]

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 2**20


@dataclass(frozen=True)
class CopyStats:
    """What a copy moved."""

    files: int
    bytes: int


def _join(base: str, rel: str) -> str:
    return posixpath.join(base, rel) if base else rel


def _copy_file(src: Storage, src_key: str, dst: Storage, dst_key: str, bar: tqdm) -> int:
    copied = 0
    with src.open(src_key, "rb") as reader, dst.atomic_write(dst_key) as writer:
        while True:
            chunk = reader.read(CHUNK_BYTES)
            if not chunk:
                break
            writer.write(chunk)
            copied += len(chunk)
            bar.update(len(chunk))
    return copied


def copy_tree(
    src: Storage,
    src_key: str,
    dst: Storage,
    dst_key: str,
    *,
    progress: bool | None = None,
    progress_file: TextIO | None = None,
    commit: bool = False,
) -> CopyStats:
    """Copy every file below ``src_key`` of ``src`` to ``dst_key`` of ``dst``.

    ``progress``: show a tqdm bar in bytes (None = only when ``progress_file``, default stderr, is
    a terminal). A source commit marker is not copied; pass ``commit=True`` to commit the
    destination after all files arrived. Raises StorageNotFoundError if the source has no files.
    """
    from tqdm import tqdm  # imported here: its import is slow, and probe processes never copy

    src_base, dst_base = normalize_key(src_key), normalize_key(dst_key)
    files = {rel: size for rel, size in src.walk_files(src_base).items() if rel != COMMIT_MARKER}
    if not files and not src.exists(src_base):
        raise StorageNotFoundError(f"copy: source {src.url_for(src_base)} does not exist")
    stream = progress_file if progress_file is not None else sys.stderr
    show = stream.isatty() if progress is None else progress
    total = sum(files.values())
    desc = f"copy -> {dst.url_for(dst_base)}"
    copied_bytes = 0
    with tqdm(
        total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, file=stream, disable=not show
    ) as bar:
        for rel in files:
            source_key, target_key = _join(src_base, rel), _join(dst_base, rel)

            def attempt(source_key: str = source_key, target_key: str = target_key) -> int:
                start = bar.n
                try:
                    return _copy_file(src, source_key, dst, target_key, bar)
                except Exception:
                    bar.update(start - bar.n)  # roll the bar back; a retry starts the file over
                    raise

            copied_bytes += dst.run("copy", target_key, attempt)
    logger.info(
        "copied %d files (%d bytes) from %s to %s",
        len(files),
        copied_bytes,
        src.url_for(src_base),
        dst.url_for(dst_base),
    )
    if commit:
        commit_directory(dst, dst_base)
    return CopyStats(files=len(files), bytes=copied_bytes)
