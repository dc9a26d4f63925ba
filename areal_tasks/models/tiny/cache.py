"""A content-addressed on-disk cache of built artefacts (tiny models, the tiny tokenizer).

An entry is a directory named by the caller (normally ``<what>-<hash of its inputs>``). It is built
through :func:`storage.atomic.atomic_directory` in its ``keep`` mode: in a private staging directory
beside its final place, then renamed into place, which is atomic on one file system. A reader sees
either no entry or a complete one, and when two test processes build the same entry at once, the
first rename wins and the loser discards its copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from areal_tasks.errors import ModelError

logger = logging.getLogger(__name__)

CACHE_ENV = "AREAL_CACHE_DIR"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The tiny-kit cache folder: ``cache_dir``, else ``$AREAL_CACHE_DIR/tiny``, else ``~/.cache/areal_tasks/tiny``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser() / "tiny"
    return Path.home() / ".cache" / "areal_tasks" / "tiny"


def content_hash(payload: dict[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable ``payload`` (key order does not matter)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def get_or_build(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """Return ``root/name``, building it with ``build(tmp_dir)`` first if it is not there yet."""
    final = root / name
    if final.is_dir():
        logger.debug("cache hit: %s", final)
        return final
    from storage.atomic import atomic_directory

    with atomic_directory(final, on_exists="keep") as staging:
        build(staging)
    logger.info("built %s", final)
    return final


def copy_tree_files(src: Path, dst: Path) -> Path:
    """Copy the files of the flat directory ``src`` into ``dst`` (created), replacing same-named files.

    Files are copied, not hard-linked: a caller that later rewrites a file in ``dst`` (save_pretrained
    truncates in place) must not corrupt the cache entry.
    """
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file():
            shutil.copy2(item, dst / item.name)
    return dst


def deliver(cached: Path, target: Path | None) -> Path:
    """``cached`` itself (``target`` None), or its files copied to ``target`` (ModelError naming the
    target when it cannot be written)."""
    if target is None:
        return cached
    try:
        return copy_tree_files(cached, target)
    except OSError as exc:
        raise ModelError(f"cannot write the tiny model to {target}: {exc.strerror or exc}") from exc
