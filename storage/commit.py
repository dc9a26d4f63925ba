"""Atomic directory commits: a directory counts only once its ``_COMMITTED`` marker exists.

S3 has no rename, so the one rule that works everywhere is: write every file, then write a marker
(atomically) that lists them; readers trust only directories that carry it. On a mounted
filesystem :func:`staged_directory` does better still: files go to a hidden sibling
``.staging-<name>-<id>`` which gets the marker and is then renamed into place in one step, so even
a reader that ignores markers never sees a half-written directory. On object stores (``s3``,
``memory``) files are written in place and the marker comes last.

The marker is JSON: ``{"format": 1, "committed_at": ISO-8601, "files": {key: size}, "metadata": {...}}``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import posixpath
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from storage.atomic import TEMP_PREFIX
from storage.errors import CommitError, StorageError, StorageNotFoundError
from storage.url import normalize_key

if TYPE_CHECKING:
    from storage.storage import Storage

__all__ = [
    "COMMIT_MARKER",
    "STAGING_PREFIX",
    "commit_directory",
    "is_committed",
    "list_committed",
    "list_uncommitted",
    "read_commit",
    "staged_directory",
    "verify_commit",
]

logger = logging.getLogger(__name__)

COMMIT_MARKER = "_COMMITTED"
STAGING_PREFIX = ".staging-"
MARKER_FORMAT = 1


def _marker_key(key: str) -> str:
    return posixpath.join(normalize_key(key), COMMIT_MARKER) if normalize_key(key) else COMMIT_MARKER


def _is_bookkeeping(rel: str) -> bool:
    name = posixpath.basename(rel)
    return rel == COMMIT_MARKER or name.startswith(TEMP_PREFIX)


def commit_directory(storage: Storage, key: str, metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Mark the directory ``key`` (every file already written) as committed; returns the marker.

    Raises CommitError if it is already committed.
    """
    if is_committed(storage, key):
        raise CommitError(f"{storage.url_for(key)} is already committed; write to a new directory instead")
    files = {rel: size for rel, size in storage.walk_files(key).items() if not _is_bookkeeping(rel)}
    marker = {
        "format": MARKER_FORMAT,
        "committed_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "files": files,
        "metadata": dict(metadata or {}),
    }
    storage.write_text(_marker_key(key), json.dumps(marker, indent=1, sort_keys=True))
    logger.info("committed %s (%d files)", storage.url_for(key), len(files))
    return marker


def is_committed(storage: Storage, key: str) -> bool:
    """Whether the directory ``key`` carries a commit marker."""
    return storage.exists(_marker_key(key))


def read_commit(storage: Storage, key: str) -> dict[str, Any]:
    """The marker of the committed directory ``key``; StorageNotFoundError if it is not committed."""
    text = storage.read_text(_marker_key(key))
    try:
        marker = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommitError(f"commit marker of {storage.url_for(key)} is not valid JSON: {exc}") from exc
    if (
        not isinstance(marker, dict)
        or marker.get("format") != MARKER_FORMAT
        or not isinstance(marker.get("files"), dict)
    ):
        raise CommitError(
            f"commit marker of {storage.url_for(key)} has an unknown layout (format {MARKER_FORMAT} expected)"
        )
    return marker


def verify_commit(storage: Storage, key: str) -> list[str]:
    """Problems with the committed directory ``key``: files listed in its marker that are missing or
    have another size. An empty list means every file is there."""
    expected: dict[str, int] = read_commit(storage, key)["files"]
    present = storage.walk_files(key)
    problems = []
    for rel, size in sorted(expected.items()):
        if rel not in present:
            problems.append(f"{rel}: missing")
        elif present[rel] != size:
            problems.append(f"{rel}: size {present[rel]} != {size} recorded at commit")
    return problems


def _subdirectories(storage: Storage, key: str) -> list[str]:
    try:
        names = storage.list(key)
    except StorageNotFoundError:
        return []
    return [
        name
        for name in names
        if storage.is_dir(posixpath.join(normalize_key(key), name) if normalize_key(key) else name)
    ]


def list_committed(storage: Storage, key: str = "") -> list[str]:
    """Names of the committed subdirectories of ``key`` (sorted; staging areas never appear)."""
    base = normalize_key(key)
    out = []
    for name in _subdirectories(storage, key):
        if name.startswith(STAGING_PREFIX):
            continue
        if is_committed(storage, posixpath.join(base, name) if base else name):
            out.append(name)
    return out


def list_uncommitted(storage: Storage, key: str = "") -> list[str]:
    """Names of the subdirectories of ``key`` that are not committed (leftovers of failed writes)."""
    committed = set(list_committed(storage, key))
    return [name for name in _subdirectories(storage, key) if name not in committed]


@contextmanager
def staged_directory(storage: Storage, key: str, metadata: Mapping[str, Any] | None = None) -> Iterator[Storage]:
    """Yield a Storage to write the directory ``key`` into; commit it when the block succeeds.

    If the block raises, everything it wrote is removed and the error propagates. An uncommitted
    leftover at ``key`` (a crashed earlier attempt) is removed before the new one is published.
    """
    key = normalize_key(key)
    if not key:
        raise CommitError("staged_directory needs a directory key below the storage root")
    if is_committed(storage, key):
        raise CommitError(f"{storage.url_for(key)} is already committed; write to a new directory instead")
    if storage.is_local:
        parent, name = posixpath.split(key)
        stage = posixpath.join(parent, f"{STAGING_PREFIX}{name}-{uuid.uuid4().hex[:12]}")
    else:
        stage = key
        _remove_leftover(storage, key)
    storage.makedirs(stage)
    try:
        yield storage.child(stage)
        commit_directory(storage, stage, metadata)
        if stage != key:
            _remove_leftover(storage, key)
            source, target = storage.fs_path(stage), storage.fs_path(key)
            storage.run("publish", key, lambda: os.rename(source, target), retry=False)
    except BaseException:
        logger.warning("discarding the partial directory %s", storage.url_for(stage))
        try:
            storage.delete(stage, recursive=True, missing_ok=True)
        except StorageError as cleanup_error:
            # the original failure matters more; the leftover stays uncommitted, so readers ignore it
            logger.error("could not remove %s: %s", storage.url_for(stage), cleanup_error)
        raise


def _remove_leftover(storage: Storage, key: str) -> None:
    if storage.exists(key):
        logger.warning("removing uncommitted leftovers at %s before writing it again", storage.url_for(key))
        storage.delete(key, recursive=True, missing_ok=True)
