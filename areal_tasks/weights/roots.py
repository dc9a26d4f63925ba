"""Where a server may read weights from: the directories an update's path must lie in.

A weight update names a directory (``/update_weights_from_disk``, the vLLM plugin's
``/update_weights``) and its index names shard files; both come from whoever may call the server's
admin routes. :class:`WeightRoots` keeps those reads inside directories the operator chose (the
served model's directory and ``--weight-root`` ones; a job's servers add the run's ``weights/``):

* the directory must resolve (symlinks followed) inside a root;
* a shard name from an index must be a plain relative name (no ``..``, not absolute) and the file
  must resolve inside a root, so neither an index entry nor a symlink leads out of them;
* a Hugging Face cache snapshot (``.../models--org--name/snapshots/<rev>``), whose files are
  symlinks into the repository's ``blobs/``, brings that ``blobs/`` along as a root.

Whatever fails (outside the roots, missing, not a directory, unreadable), the caller gets one
message, :func:`not_readable`, which names only the path it sent: it cannot tell a file that exists
outside the roots from one that does not. A check-then-open race remains for someone who can write
inside a root, who could replace the weights anyway.

Torch-free.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from areal_tasks.errors import WeightTransportError

logger = logging.getLogger(__name__)

__all__ = ["WEIGHT_ROOTS_ENV", "WeightRoots", "not_readable", "roots_from_env"]

#: extra weight roots of a server that takes no flags of ours (the vLLM plugin), ``os.pathsep``-separated.
WEIGHT_ROOTS_ENV = "AREAL_WEIGHT_ROOTS"


def not_readable(path: str | os.PathLike[str]) -> WeightTransportError:
    """The one error for weights that are missing, unreadable or outside the allowed roots."""
    return WeightTransportError(
        f"weights at {str(path)!r} are missing or not readable under the server's weight roots "
        "(the served model's directory and --weight-root)"
    )


def roots_from_env(environ: Mapping[str, str]) -> list[str]:
    """The directories :data:`WEIGHT_ROOTS_ENV` lists in ``environ`` (none when unset)."""
    return [part for part in environ.get(WEIGHT_ROOTS_ENV, "").split(os.pathsep) if part]


def _resolve(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(os.path.expanduser(os.fspath(path))))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _with_hf_blobs(root: Path) -> list[Path]:
    """``root`` and, for a Hugging Face cache snapshot, its repository's ``blobs/``."""
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith(("models--", "datasets--")):
        return [root, root.parent.parent / "blobs"]
    return [root]


@dataclass(frozen=True)
class WeightRoots:
    """Resolved directories weights may be read from (see the module docstring)."""

    dirs: tuple[Path, ...]

    @classmethod
    def of(cls, paths: Iterable[str | os.PathLike[str]]) -> WeightRoots:
        """The roots ``paths`` name, resolved now (a root that does not exist yet, such as a run's
        ``weights/`` before the first update, is kept: a load is checked when it comes)."""
        dirs: list[Path] = []
        for path in paths:
            for root in _with_hf_blobs(_resolve(path)):
                if root not in dirs:
                    dirs.append(root)
        return cls(tuple(dirs))

    def __contains__(self, path: object) -> bool:
        return isinstance(path, Path) and any(_inside(path, root) for root in self.dirs)

    def directory(self, path: str | os.PathLike[str]) -> Path:
        """The resolved weight directory ``path`` names; :func:`not_readable` unless it is a
        readable directory inside a root."""
        resolved = _resolve(path)
        if resolved not in self or not resolved.is_dir() or not os.access(resolved, os.R_OK | os.X_OK):
            if resolved not in self:
                logger.warning("refused a weight load outside the weight roots: %r", os.fspath(path))
            raise not_readable(path)
        return resolved

    def shard(self, directory: Path, name: object) -> Path:
        """The resolved file ``name`` (an index entry) of ``directory`` (already resolved);
        :func:`not_readable` unless it is a plain relative name whose file resolves inside a root."""
        if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
            raise not_readable(str(name))
        pure = PurePosixPath(name)
        if pure.is_absolute() or ".." in pure.parts:
            logger.warning("refused a weight shard name that leaves its directory: %r", name)
            raise not_readable(name)
        resolved = _resolve(directory / pure)
        if resolved not in self or not resolved.is_file() or not os.access(resolved, os.R_OK):
            if resolved not in self:
                logger.warning("refused a weight shard that resolves outside the weight roots: %r", name)
            raise not_readable(name)
        return resolved
