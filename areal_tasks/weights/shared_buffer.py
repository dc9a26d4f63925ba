"""The buffers of shared-memory weight updates: memory the trainer and the servers on its host share.

Every trainer rank that holds one keeps a :class:`SharedWeightBuffer` for the run, the size of
the published weights, laid out as one flattened bucket (:func:`shared_layout`: the bytes of
``flatten_bucket`` over all specs). A server opens it once from its JSON description
(:func:`pick_buffer`, :func:`open_shared_buffer`) and copies out of it while paused: one
device-to-device copy. The transport that uses them is :mod:`areal_tasks.weights.shared`.

* **CUDA**: the buffer is a ``uint8`` tensor on the rank's GPU, shared by CUDA IPC. Its
  description carries torch's IPC handle of the allocation (``UntypedStorage._share_cuda_``, the
  fields ``torch.multiprocessing`` pickles, here as JSON with the bytes base64-encoded) and the
  GPU's UUID, so a server whose ``CUDA_VISIBLE_DEVICES`` numbers the GPUs differently still finds
  it, and a server on another GPU gets a clear error rather than a wrong device.
* **CPU**: the buffer is a file in ``/dev/shm`` mapped by both sides (``torch.from_file``); the
  trainer deletes it when it closes the buffer (a server's mapping stays valid until it drops it).
  A server maps only files that look like a trainer's buffer (the name, the directory, a regular
  file of this user), never another path a description names.
  The file's name carries the trainer's PID namespace and pid: making a buffer removes the files
  of trainers of the same namespace that are gone (killed before they could delete theirs), so a
  crash does not keep host memory.

No pickle crosses the wire: a description is a dict of strings and integers that only the
functions here read and write. Ordering: :meth:`SharedWeightBuffer.pack` waits for its copies to
finish before it returns, and a server waits for its copy out of the buffer before it answers, so
neither side needs the other's stream.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import WeightTransportError
from areal_tasks.weights.buckets import bucket_views, check_bucket_tensor

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.inference import ParamSpec

logger = logging.getLogger(__name__)

__all__ = ["SharedWeightBuffer", "open_shared_buffer", "pick_buffer", "shared_layout"]

#: description kinds: ``cuda_ipc`` (a GPU allocation) and ``file`` (a shared-memory file on the host).
CUDA_IPC, FILE = "cuda_ipc", "file"
#: bytes of full tensors a pack holds before it copies them into the buffer (one ``_foreach_copy_``).
PACK_GROUP_BYTES = 256 * 2**20
#: a CPU buffer's file is ``<shm>/areal-weights-<pid namespace>-<trainer pid>-<buffer id>``.
_FILE_PREFIX = "areal-weights-"


def shared_layout(specs: Sequence[ParamSpec]) -> list[ParamSpec]:
    """The order the tensors lie in a shared buffer: ``specs`` as one flattened bucket (ordered so
    every tensor's offset is a multiple of its element size), the order the servers are sent."""
    from areal_tasks.api.inference import plan_weight_buckets

    if not specs:
        raise WeightTransportError("a shared weight buffer needs at least one tensor")
    return plan_weight_buckets(specs, max(1, sum(spec.nbytes for spec in specs)))[0]


def _copy_group(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy ``sources`` into ``targets`` with one ``_foreach_copy_`` and empty both lists."""
    import torch

    if targets:
        with torch.no_grad():
            torch._foreach_copy_(targets, sources)
        targets.clear()
        sources.clear()


def _shm_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _pid_namespace() -> str:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``; "0" where unreadable):
    a pid means a process only within its namespace, and containers may share ``/dev/shm``."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _buffer_file_name(buffer_id: str) -> str:
    return f"{_FILE_PREFIX}{_pid_namespace()}-{os.getpid()}-{buffer_id}"


def _sweep_orphans(directory: Path) -> None:
    """Delete buffer files of trainers that are gone (killed before they could delete their own):
    those named with this PID namespace and a pid no process has. Files of other namespaces (other
    containers sharing ``/dev/shm``) are left alone: their pids mean nothing here."""
    namespace = _pid_namespace()
    for path in directory.glob(f"{_FILE_PREFIX}*"):
        parts = path.name[len(_FILE_PREFIX) :].split("-", 2)
        if len(parts) != 3 or parts[0] != namespace or not parts[1].isdigit() or int(parts[1]) == os.getpid():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
            logger.warning("removed %s: its trainer (pid %s) is gone", path, parts[1])
        except PermissionError:  # a live process of another user
            continue


def _gpu_uuid(index: int) -> str:
    import torch

    return str(torch.cuda.get_device_properties(index).uuid)


class SharedWeightBuffer:
    """One trainer rank's buffer for the run; :meth:`describe` is what the servers need to open it."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        import torch

        if nbytes < 1:
            raise WeightTransportError(f"a shared weight buffer needs at least one byte, got {nbytes}")
        self.nbytes = nbytes
        self.device = device
        self.buffer_id = uuid.uuid4().hex
        self._path: Path | None = None
        self._views: tuple[tuple[ParamSpec, ...], dict[str, torch.Tensor]] | None = None
        if device.type == "cuda":
            self.flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
            self._description = self._describe_cuda()
        elif device.type == "cpu":
            directory = _shm_dir()
            _sweep_orphans(directory)
            self._path = directory / _buffer_file_name(self.buffer_id)
            self.flat = torch.from_file(str(self._path), shared=True, size=nbytes, dtype=torch.uint8)
            self._description = {"kind": FILE, "id": self.buffer_id, "nbytes": nbytes, "path": str(self._path)}
        else:
            raise WeightTransportError(f"shared weight updates run on cuda or cpu, not on {device.type!r}")
        logger.info("shared weight buffer %s: %.1f MiB on %s", self.buffer_id[:8], nbytes / 2**20, device)

    def _describe_cuda(self) -> dict[str, Any]:
        (device, handle, size_bytes, offset_bytes, ref_handle, ref_offset, event_handle, event_sync) = (
            self.flat.untyped_storage()._share_cuda_()
        )
        return {
            "kind": CUDA_IPC,
            "id": self.buffer_id,
            "nbytes": self.nbytes,
            "gpu_uuid": _gpu_uuid(device),
            "handle": _b64(handle),
            "storage_bytes": int(size_bytes),
            "storage_offset": int(offset_bytes),
            "ref_counter_handle": _b64(ref_handle),
            "ref_counter_offset": int(ref_offset),
            "event_handle": _b64(event_handle or b""),
            "event_sync_required": int(bool(event_sync)),
        }

    def describe(self) -> dict[str, Any]:
        """The JSON-safe description a server opens the buffer from (:func:`open_shared_buffer`)."""
        return dict(self._description)

    def pack(self, specs: Sequence[ParamSpec], named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Write the ``(name, tensor)`` stream into the buffer laid out as ``specs`` (each tensor cast
        to its spec's dtype; any order) and wait until the bytes are there, so a server may read
        them from another process.

        The buffer's slices are made once per layout, and the tensors go in by ``_foreach_copy_``
        in groups of up to :data:`PACK_GROUP_BYTES`: a 0.5B model is 291 tensors, and slicing and
        copying each one by one cost more host time than the copies themselves, while a stream
        gathered from shards holds at most one group of full tensors at a time. Raises
        :class:`WeightTransportError` when a tensor is not in the layout, does not match its spec, or is
        missing (the buffer then holds a partial update: no server reads it)."""
        import torch

        views = self._views_for(specs)
        by_name = {spec.name: spec for spec in specs}
        targets: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        pending, seen = 0, set()
        for name, tensor in named:
            spec = by_name.get(name)
            if spec is None:
                raise WeightTransportError(f"{name!r} is not in the shared buffer's layout ({len(views)} tensors)")
            check_bucket_tensor(spec, tensor)
            seen.add(name)
            targets.append(views[name])
            sources.append(tensor.detach())
            pending += spec.nbytes
            if pending >= PACK_GROUP_BYTES:
                _copy_group(targets, sources)
                pending = 0
        _copy_group(targets, sources)
        missing = [name for name in views if name not in seen]
        if missing:
            raise WeightTransportError(
                f"the weights to pack lack {len(missing)} tensors of the layout, e.g. {missing[:3]}"
            )
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _views_for(self, specs: Sequence[ParamSpec]) -> dict[str, torch.Tensor]:
        """The buffer's slices for ``specs`` laid out back to back, by name (cached for the last layout)."""
        key = tuple(specs)
        if self._views is None or self._views[0] != key:
            nbytes = sum(spec.nbytes for spec in specs)
            if nbytes != self.nbytes:
                raise WeightTransportError(f"the layout holds {nbytes} bytes, the shared buffer {self.nbytes}")
            self._views = (key, bucket_views(self.flat, specs))
        return self._views[1]

    def close(self) -> None:
        """Drop the buffer (and delete a CPU buffer's file); servers keep what they mapped."""
        if self._path is not None:
            self._path.unlink(missing_ok=True)
            self._path = None
        self._views = None
        self.flat = None  # type: ignore[assignment]


def pick_buffer(descriptions: Sequence[Mapping[str, Any]], device: torch.device) -> Mapping[str, Any]:
    """The description a server on ``device`` reads: the buffer on its own GPU, or on CPU the first.

    Raises :class:`WeightTransportError` naming the GPUs the buffers are on when none is on ``device``'s.
    """
    if not descriptions:
        raise WeightTransportError("a shared weight update names no buffer; the trainer packs one before the update")
    if device.type != "cuda":
        files = [d for d in descriptions if d.get("kind") == FILE]
        if not files:
            raise WeightTransportError("the trainer's shared weight buffers are on GPUs; a CPU server cannot read them")
        return files[0]
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    mine = _gpu_uuid(index)
    for description in descriptions:
        if description.get("kind") == CUDA_IPC and description.get("gpu_uuid") == mine:
            return description
    where = sorted({str(d.get("gpu_uuid", d.get("kind"))) for d in descriptions})
    raise WeightTransportError(
        f"no shared weight buffer is on this server's GPU ({mine}); the trainer's are on {where}. "
        "Shared updates need each server on a GPU of a trainer rank (colocated); "
        "otherwise use rollout.weight_update=disk or collective"
    )


def open_shared_buffer(description: Mapping[str, Any]) -> torch.Tensor:
    """The ``uint8`` tensor a description names (a server's view of a trainer's buffer).

    A ``file`` buffer must be one of this project's: a regular file named like the trainer names
    its buffers (``areal-weights-*``) directly in this host's shared-memory directory, owned by
    this user (:func:`_buffer_file`). Raises :class:`WeightTransportError` when the description is
    malformed or the memory cannot be opened (another host, a buffer that is gone, a path that is
    not an areal buffer: one message for all three).
    """
    import torch

    kind, nbytes = description.get("kind"), description.get("nbytes")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 1:
        raise WeightTransportError(f"shared weight buffer: 'nbytes' must be a positive int, got {nbytes!r}")
    try:
        if kind == FILE:
            path = _buffer_file(description.get("path"), nbytes)
            return torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        if kind == CUDA_IPC:
            return _open_cuda(description, nbytes)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise WeightTransportError(
            f"cannot open shared weight buffer {description.get('id')!r} ({kind}): {exc}"
        ) from exc
    raise WeightTransportError(f"shared weight buffer: unknown kind {kind!r} (known: {CUDA_IPC!r}, {FILE!r})")


#: the names :func:`_buffer_file_name` gives: ``areal-weights-<pid namespace>-<pid>-<hex id>``.
_BUFFER_NAME = re.compile(re.escape(_FILE_PREFIX) + r"[0-9]+-[0-9]+-[0-9a-f]+")


def _buffer_file(path: object, nbytes: int) -> Path:
    """``path`` when it is a trainer's buffer file of at least ``nbytes`` bytes: named
    :data:`_BUFFER_NAME`, directly in :func:`_shm_dir`, a regular file (not a symlink) owned by
    this user. Anything else gets one message, whether the path exists or not."""
    refused = WeightTransportError(
        f"shared weight buffer {str(path)!r} is missing or shorter than {nbytes} bytes, or not an areal "
        f"weight buffer ({_FILE_PREFIX}* in {_shm_dir()}, owned by this user): the trainer must run "
        "on this host and keep the buffer open"
    )
    if not isinstance(path, str) or not path:
        raise refused
    candidate = Path(path)
    if not _BUFFER_NAME.fullmatch(candidate.name) or os.path.realpath(candidate.parent) != os.path.realpath(_shm_dir()):
        logger.warning("refused a shared weight buffer outside %s/%s*: %r", _shm_dir(), _FILE_PREFIX, path)
        raise refused
    try:
        info = candidate.lstat()
    except OSError:
        raise refused from None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size < nbytes:
        raise refused
    return candidate


def _open_cuda(description: Mapping[str, Any], nbytes: int) -> torch.Tensor:
    import torch

    target = str(description["gpu_uuid"])
    local = [i for i in range(torch.cuda.device_count()) if _gpu_uuid(i) == target]
    if not local:
        raise WeightTransportError(f"GPU {target} holding the shared weight buffer is not visible to this process")
    torch.cuda._lazy_init()
    storage = torch.UntypedStorage._new_shared_cuda(
        local[0],
        base64.b64decode(description["handle"]),
        int(description["storage_bytes"]),
        int(description["storage_offset"]),
        base64.b64decode(description["ref_counter_handle"]),
        int(description["ref_counter_offset"]),
        base64.b64decode(description["event_handle"]),
        bool(description["event_sync_required"]),
    )
    flat = torch.empty(0, dtype=torch.uint8, device=torch.device("cuda", local[0]))
    flat.set_(storage, 0, (nbytes,), (1,))
    return flat
