"""Read a YAML config file and the chain of files it extends through ``base:``.

``base: other.yaml`` (a path relative to the file that names it) makes the file a child of
``other.yaml``: the base is loaded first (recursively, so chains work), then the child is deep-merged
over it (:mod:`areal_tasks.config.merge`). A file that extends itself, directly or through others,
is an error that shows the cycle.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from areal_tasks.config.merge import Origins, deep_merge, record_origins
from areal_tasks.config.yaml_io import load_yaml
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

#: the top-level key that names the file a config extends.
BASE_KEY = "base"


def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from exc
    data = load_yaml(text, source=str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a config file must be a mapping of sections (experiment:, actor:, ...), "
            f"got a {type(data).__name__}"
        )
    return data


def _base_path(path: Path, data: dict[str, Any]) -> Path | None:
    base = data.pop(BASE_KEY, None)
    if base is None:
        return None
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: '{BASE_KEY}' must be a file path relative to this file, got {base!r}")
    target = (path.parent / Path(base).expanduser()).resolve()
    if not target.is_file():
        raise ConfigError(
            f"{path}: {BASE_KEY}: {base!r} not found (looked for {target}); "
            "the path is relative to the file that names it"
        )
    return target


def load_tree(path: str | Path, schema: type | None = None) -> tuple[dict[str, Any], Origins]:
    """The merged plain-data tree of ``path`` and its bases, and where each key was set.

    ``schema`` (the root dataclass type) lets the merge restart a tagged-union section whose
    ``name`` a child changes.
    """
    start = Path(path).expanduser().resolve()
    if not start.is_file():
        raise ConfigError(f"config file not found: {path} (looked for {start})")
    chain: list[tuple[Path, dict[str, Any]]] = []
    current: Path | None = start
    while current is not None:
        seen = [p for p, _ in chain]
        if current in seen:
            cycle = " -> ".join(str(p) for p in [*seen[seen.index(current) :], current])
            raise ConfigError(f"config inheritance cycle through '{BASE_KEY}:': {cycle}")
        data = _read_mapping(current)
        next_path = _base_path(current, data)
        chain.append((current, data))
        current = next_path
    tree: dict[str, Any] = {}
    origins: Origins = {}
    for file_path, data in reversed(chain):  # root-most base first, the named file last
        tree = deep_merge(tree, data, schema)
        record_origins(origins, data, str(file_path))
    logger.debug("loaded config %s (chain of %d file(s))", start, len(chain))
    return tree, origins
