"""Checks for paths on a mounted filesystem (local disk, NFS, Lustre...): the path exists or can be
created, what filesystem holds it (and a warning when a multi-node run uses a local one), and free
space against a threshold."""

from __future__ import annotations

import errno
import os
import shutil

from storage.validate.context import CheckContext, CheckFailed, Outcome
from storage.validate.fstype import filesystem_of
from storage.validate.report import Status

__all__ = ["check_filesystem", "check_free_space", "check_path"]

_SHARED_FIX = (
    "put the run on a filesystem every node mounts at the same path (NFS, Lustre, GPFS, CephFS...) "
    "or on object storage (s3://)"
)


def check_path(ctx: CheckContext) -> Outcome:
    """The path is a directory, or can be created (it is created then)."""
    path = ctx.storage.fs_path()
    if os.path.isdir(path):
        return Outcome(f"{path} exists", {"created": False})
    if os.path.exists(path):
        raise CheckFailed(f"{path} exists but is not a directory", "remove the file or choose another path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "create it as a user who may, grant this user write access to its parent, or choose a writable path"
        elif exc.errno == errno.ENOTDIR:
            fix = "a component of the path is a file, not a directory; correct the path"
        else:
            fix = "create the parent directory first or choose another path"
        raise CheckFailed(f"cannot create {path}: {exc.strerror or exc}", fix, {"errno": exc.errno}) from exc
    return Outcome(f"{path} did not exist and was created", {"created": True})


def check_filesystem(ctx: CheckContext) -> Outcome:
    """Report the filesystem type; warn when a multi-node run would use a node-local filesystem."""
    info = filesystem_of(ctx.storage.fs_path())
    details = {"fs_type": info.fs_type, "mount_point": info.mount_point, "sharing": info.sharing}
    summary = f"{info.fs_type} mounted at {info.mount_point} ({info.sharing})"
    if ctx.nodes > 1 and info.sharing == "local":
        return Outcome(
            f"{summary}: a {ctx.nodes}-node run on a node-local filesystem gives each node its own copy of the "
            "files (checkpoints written by one node are invisible to the others)",
            details,
            Status.WARN,
            _SHARED_FIX,
        )
    if ctx.nodes > 1 and info.sharing == "unknown":
        return Outcome(
            f"{summary}: cannot tell whether it is shared between nodes; the multi-node probe decides",
            details,
            Status.WARN,
            "run with --nodes N so the probe proves every node sees the same files",
        )
    return Outcome(summary, details)


def check_free_space(ctx: CheckContext) -> Outcome:
    """Free space at the path against ``thresholds.min_free_gb``."""
    usage = shutil.disk_usage(ctx.storage.fs_path())
    free_gb = usage.free / 1e9
    details = {"free_gb": round(free_gb, 3), "total_gb": round(usage.total / 1e9, 3)}
    required = ctx.thresholds.min_free_gb
    if required is not None and free_gb < required:
        details["min_free_gb"] = required
        raise CheckFailed(
            f"only {free_gb:.2f} GB free, {required:g} GB required",
            "free space on this filesystem, choose a larger one, or lower --min-free-gb if the run needs less",
            details,
        )
    return Outcome(
        f"{free_gb:.2f} GB free" + (f" (>= {required:g} GB required)" if required is not None else ""), details
    )
