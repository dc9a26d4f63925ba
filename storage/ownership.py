"""Which files of a local directory a writer of ours put there: the ownership manifest.

:func:`storage.atomic.atomic_directory` publishes directories for several writers (an HF export, a
disk weight update, an engine's HF save). A directory it publishes carries ``.areal-written.json``,
the list of files it wrote. That list is what lets a later write into the same place tell its own
earlier output (which it may replace) from files someone else put there (which it must never
delete): a user's notes next to an export, a model directory that merely has the same name.

Ownership is by relative path: a file is *owned* when the manifest lists it; anything else under the
directory (files, symbolic links, directories holding no owned file) is *foreign*. An unreadable
manifest owns nothing, so the worst a damaged manifest can cause is a refusal, never a deletion.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from storage.errors import StorageError

__all__ = [
    "MANIFEST",
    "ON_EXISTS",
    "Inventory",
    "OnExists",
    "check_target",
    "inventory",
    "manifest_text",
    "tree_files",
]

logger = logging.getLogger(__name__)

#: the manifest's file name, in the root of every directory published with ownership.
MANIFEST = ".areal-written.json"
MANIFEST_FORMAT = 1
#: files named in an error message at most.
SHOWN = 5

#: what :func:`storage.atomic.atomic_directory` does when its target already exists (see there).
OnExists = Literal["refuse", "replace_owned", "merge_owned", "keep"]
ON_EXISTS: tuple[str, ...] = ("refuse", "replace_owned", "merge_owned", "keep")


@dataclass(frozen=True)
class Inventory:
    """An existing directory sorted by ownership (relative POSIX paths)."""

    #: regular files the manifest lists.
    owned: frozenset[str]
    #: everything else: unlisted files, links, other entries, directories holding no owned file.
    foreign: tuple[str, ...]

    def describe_foreign(self) -> str:
        shown = ", ".join(self.foreign[:SHOWN])
        more = len(self.foreign) - SHOWN
        return shown + (f" and {more} more" if more > 0 else "")


def tree_files(root: Path) -> list[str]:
    """Every regular file under ``root`` (relative POSIX paths, sorted), the manifest excepted."""
    out = []
    for dirpath, _, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def manifest_text(files: Iterable[str], writer: str) -> str:
    """The manifest listing ``files`` as written by ``writer``."""
    return json.dumps({"format": MANIFEST_FORMAT, "writer": writer, "files": sorted(set(files))}, indent=1) + "\n"


def _listed(directory: Path) -> set[str]:
    """The files ``directory``'s manifest lists (none when it has no readable manifest)."""
    path = directory / MANIFEST
    if not path.is_file() or path.is_symlink():
        return set()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = data["files"]
        if data.get("format") != MANIFEST_FORMAT or not all(isinstance(f, str) for f in files):
            raise ValueError(f"unexpected manifest layout (format {data.get('format')!r})")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        logger.warning(
            "ignoring the unreadable manifest %s (%s): no file of %s counts as written by us", path, exc, directory
        )
        return set()
    return set(files)


def inventory(directory: Path) -> Inventory:
    """Sort the entries under the existing ``directory`` into owned and foreign (see the module docstring)."""
    listed = _listed(directory)
    owned: set[str] = set()
    foreign: list[str] = []
    dirs: list[str] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        rel_dir = Path(dirpath).relative_to(directory)
        for name in dirnames:
            path = Path(dirpath) / name
            rel = (rel_dir / name).as_posix()
            if path.is_symlink():  # os.walk does not enter links
                foreign.append(rel)
            else:
                dirs.append(rel)
        for name in filenames:
            path = Path(dirpath) / name
            rel = (rel_dir / name).as_posix()
            if rel == MANIFEST and not path.is_symlink():
                continue
            if rel in listed and path.is_file() and not path.is_symlink():
                owned.add(rel)
            else:
                foreign.append(rel)
    parents = {parent.as_posix() for rel in owned for parent in Path(rel).parents}
    foreign.extend(d for d in dirs if d not in parents and not _holds_foreign(d, foreign))
    return Inventory(owned=frozenset(owned), foreign=tuple(sorted(foreign)))


def _holds_foreign(directory: str, foreign: list[str]) -> bool:
    """Whether a foreign entry lies below ``directory`` (then that entry is named, not the directory)."""
    prefix = directory + "/"
    return any(f.startswith(prefix) for f in foreign)


def _entries(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError as exc:
        raise StorageError(f"cannot list {directory}: {exc}") from exc


def check_target(target: str | os.PathLike[str], on_exists: OnExists) -> None:
    """Refuse, before any work is done, a ``target`` that ``on_exists`` does not allow writing.

    Every mode refuses a target that exists but is not a directory (a file, a link, a device).
    ``refuse`` also refuses a non-empty directory; ``replace_owned`` one holding a foreign entry;
    ``merge_owned`` and ``keep`` accept any directory (their collisions are found at publish time).
    """
    if on_exists not in ON_EXISTS:
        raise StorageError(f"on_exists must be one of {ON_EXISTS}, got {on_exists!r}")
    path = Path(target)
    if not os.path.lexists(path):
        return
    if path.is_symlink() and on_exists != "keep":
        raise StorageError(f"{path} is a symbolic link; refusing to write a directory over it")
    if not path.is_dir():
        raise StorageError(f"{path} exists and is not a directory; refusing to replace it")
    if on_exists in ("keep", "merge_owned"):
        return
    entries = _entries(path)
    if not entries:
        return
    if on_exists == "refuse":
        shown = ", ".join(entries[:SHOWN]) + (f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else "")
        raise StorageError(f"{path} already exists and is not empty ({shown}); refusing to replace it")
    found = inventory(path)
    if found.foreign:
        raise StorageError(
            f"{path} holds files this writer did not write ({found.describe_foreign()}); refusing to replace it"
        )
