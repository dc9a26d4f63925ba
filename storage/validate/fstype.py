"""Which filesystem holds a path, and whether that filesystem is shared between machines.

The mount table (``/proc/self/mounts``) is searched for the longest mount point containing the
path's real location. ``ext4``, ``xfs``, ``overlay``, ``tmpfs``... are local to one machine; ``nfs``,
``cifs``, ``lustre``, ``gpfs``, ``cephfs``, ``beegfs`` and the like are shared; anything else
(``9p``, most FUSE filesystems) is ``unknown``, and the multi-node probe has the last word.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

__all__ = ["LOCAL_FS_TYPES", "SHARED_FS_TYPES", "FsInfo", "classify_fs_type", "filesystem_of", "parse_mounts"]

Sharing = Literal["local", "shared", "unknown"]

LOCAL_FS_TYPES = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "f2fs",
        "jfs",
        "reiserfs",
        "overlay",
        "overlayfs",
        "tmpfs",
        "ramfs",
        "devtmpfs",
        "squashfs",
        "vfat",
        "exfat",
        "ntfs",
        "ntfs3",
        "fuseblk",
        "iso9660",
    }
)
SHARED_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "ceph",
        "cephfs",
        "fuse.ceph-fuse",
        "glusterfs",
        "fuse.glusterfs",
        "beegfs",
        "wekafs",
        "pvfs2",
        "orangefs",
        "afs",
        "ocfs2",
        "gfs2",
        "fuse.juicefs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.geesefs",
        "fuse.mountpoint-s3",
        "fuse.weed",
    }
)


@dataclass(frozen=True)
class FsInfo:
    """The mount holding a path: its mount point, filesystem type and whether it is shared."""

    mount_point: str
    fs_type: str
    source: str
    sharing: Sharing


def classify_fs_type(fs_type: str) -> Sharing:
    """``local``, ``shared`` or ``unknown`` for a filesystem type name from the mount table."""
    name = fs_type.lower()
    if name in SHARED_FS_TYPES:
        return "shared"
    if name in LOCAL_FS_TYPES:
        return "local"
    return "unknown"


def _unescape(field: str) -> str:
    # the mount table escapes space, tab, newline and backslash as octal (\040 ...)
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(text: str) -> list[tuple[str, str, str]]:
    """``(source, mount_point, fs_type)`` for each line of a ``/proc/mounts``-format table."""
    entries = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            entries.append((_unescape(fields[0]), _unescape(fields[1]), fields[2]))
    return entries


def _existing_ancestor(path: str) -> str:
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return os.path.realpath(current)


def filesystem_of(path: str, mounts_text: str | None = None, *, resolve: bool = True) -> FsInfo:
    """The filesystem holding ``path`` (or, if it does not exist yet, its nearest existing parent).

    ``mounts_text`` replaces this machine's mount table; ``resolve=False`` takes ``path`` as it is
    (no symlink resolution, no walk up to an existing parent), for tables of other machines.
    """
    if mounts_text is None:
        try:
            with open("/proc/self/mounts", encoding="utf-8") as handle:
                mounts_text = handle.read()
        except FileNotFoundError:  # not Linux: no mount table to read; the type stays unknown
            mounts_text = ""
    target = _existing_ancestor(path) if resolve else os.path.normpath(path)
    best: tuple[str, str, str] | None = None
    for source, mount_point, fs_type in parse_mounts(mounts_text):
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and (best is None or len(mount_point) >= len(best[1])):
            best = (source, mount_point, fs_type)  # later entries shadow earlier ones at the same point
    if best is None:
        return FsInfo(mount_point="/", fs_type="unknown", source="", sharing="unknown")
    return FsInfo(mount_point=best[1], fs_type=best[2], source=best[0], sharing=classify_fs_type(best[2]))
