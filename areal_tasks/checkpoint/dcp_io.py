"""torch.distributed.checkpoint through :class:`storage.Storage` (file://, NFS, s3://, memory://).

Why not torch's ``FsspecWriter``/``FsspecReader``: they write pickled metadata and offer no way to
reuse bytes of an earlier checkpoint, and their streams bypass ``storage``'s atomic writes and
retry policy. This writer:

* writes one data file per rank (``dcp/rank-<r>.distcp``) through ``Storage.atomic_write`` (a
  temporary file renamed into place, or a single upload on S3), items aligned to 64 bytes;
* stores tensors raw and hashes every item (sha256); with a parent index (incremental saves) an
  item whose hash, dtype and shape match the parent's is *referenced* -- its record points at
  the bytes where they already are -- instead of being written again;
* lets the coordinator write ``dcp/index.json`` (:mod:`areal_tasks.checkpoint.dcp_index`).

The reading side is :mod:`areal_tasks.checkpoint.dcp_read`; :func:`dcp_call` (DCP's failures as
checkpoint errors) serves both.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, BinaryIO

import torch
from torch.distributed.checkpoint import SavePlan, SavePlanner, StorageWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.storage import WriteResult

from areal_tasks.checkpoint.dcp_index import ItemRecord, dtype_name, index_to_json
from areal_tasks.checkpoint.layout import DCP_INDEX, dcp_data_file
from areal_tasks.checkpoint.metadata import FileInfo, sha256_hex
from areal_tasks.errors import CheckpointError, CheckpointIntegrityError

if TYPE_CHECKING:
    from areal_tasks.checkpoint.incremental import ParentIndex
    from storage import Storage

logger = logging.getLogger(__name__)

ALIGN = 64
#: items hashed ahead of the one being written (each holds a host copy only for device tensors).
HASH_AHEAD = 2


def _payload(data: torch.Tensor | io.BytesIO) -> tuple[memoryview, str, str | None, tuple[int, ...] | None]:
    """(bytes to store, kind, dtype, shape) of one resolved write item."""
    if isinstance(data, io.BytesIO):
        return data.getbuffer(), "bytes", None, None
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    tensor = tensor.contiguous()
    raw = tensor.reshape(-1).view(torch.uint8).numpy()
    return memoryview(raw), "tensor", dtype_name(tensor.dtype), tuple(tensor.shape)


def _sha256(payload: memoryview) -> str:
    return hashlib.sha256(payload).hexdigest()


def _hashed_items(plan: SavePlan, planner: SavePlanner) -> Iterator[tuple[Any, tuple, str]]:
    """(item, payload tuple, sha256) in plan order. A helper thread hashes up to ``HASH_AHEAD`` items
    ahead of the caller's writes (both release the GIL), so hashing overlaps the I/O."""
    pending: collections.deque[tuple[Any, tuple, Future[str]]] = collections.deque()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dcp-hash") as pool:
        for item in plan.items:
            payload = _payload(planner.resolve_data(item))
            pending.append((item, payload, pool.submit(_sha256, payload[0])))
            if len(pending) > HASH_AHEAD:
                done = pending.popleft()
                yield done[0], done[1], done[2].result()
        while pending:
            done = pending.popleft()
            yield done[0], done[1], done[2].result()


@dataclasses.dataclass(frozen=True)
class WriteStats:
    """What one rank's writer did."""

    files: dict[str, FileInfo]
    written: int
    referenced: int
    logical: int


class StorageDCPWriter(StorageWriter):
    """DCP ``StorageWriter`` into ``<checkpoints>/<step_dir>/`` (see the module docstring)."""

    def __init__(self, checkpoints: Storage, step_dir: str, parent: ParentIndex | None = None) -> None:
        super().__init__()
        self.checkpoints = checkpoints
        self.step_dir = step_dir
        self.parent = parent
        self.rank = 0
        self.is_coordinator = True
        self.stats = WriteStats(files={}, written=0, referenced=0, logical=0)
        self.index_file: FileInfo | None = None
        #: every rank's item records (set on the coordinator by finish()).
        self.records: list[ItemRecord] = []

    def reset(self, checkpoint_id: Any = None) -> None:
        self.stats = WriteStats(files={}, written=0, referenced=0, logical=0)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs.get("rank") or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(plan, storage_data=dcp_data_file(i)) for i, plan in enumerate(plans)]

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoints.url_for(self.step_dir))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # built explicitly, never picked by DCP from a checkpoint_id

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> torch.futures.Future[list[WriteResult]]:
        rel = plan.storage_data
        key = f"{self.step_dir}/{rel}"
        results: list[WriteResult] = []
        file_digest = hashlib.sha256()
        pos = referenced = logical = 0
        with ExitStack() as stack:
            handle: BinaryIO | None = None
            for item, (payload, kind, dtype, shape), digest in _hashed_items(plan, planner):
                offset = None if item.index.offset is None else tuple(item.index.offset)
                length = payload.nbytes
                logical += length
                record = (
                    self.parent.match(item.index.fqn, offset, digest, length, dtype, shape) if self.parent else None
                )
                if record is not None:
                    referenced += length
                else:
                    if handle is None:
                        handle = stack.enter_context(self.checkpoints.atomic_write(key))
                    pad = (-pos) % ALIGN
                    if pad:
                        handle.write(b"\0" * pad)
                        pos += pad
                    handle.write(payload)
                    file_digest.update(bytes.fromhex(digest))
                    record = ItemRecord(
                        item.index.fqn, offset, kind, self.step_dir, rel, pos, length, digest, dtype, shape
                    )
                    pos += length
                results.append(WriteResult(index=item.index, size_in_bytes=length, storage_data=record))
        files = {rel: FileInfo(size=pos, sha256=file_digest.hexdigest())} if handle is not None else {}
        self.stats = WriteStats(files=files, written=pos, referenced=referenced, logical=logical)
        logger.debug(
            "rank %d wrote %d bytes for %d item bytes to %s (%d referenced)", self.rank, pos, logical, key, referenced
        )
        future: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        records = [wr.storage_data for per_rank in results for wr in per_rank]
        self.records = records
        metadata.storage_data = {wr.index: wr.storage_data for per_rank in results for wr in per_rank}
        data = json.dumps(index_to_json(metadata, records), sort_keys=True).encode("utf-8")
        self.checkpoints.write_bytes(f"{self.step_dir}/{DCP_INDEX}", data)
        self.index_file = FileInfo(size=len(data), sha256=sha256_hex(data))


@contextlib.contextmanager
def dcp_call(what: str) -> Iterator[None]:
    """Run a DCP call quietly in one process, turning its CheckpointException into CheckpointError."""
    from torch.distributed.checkpoint.api import CheckpointException

    with warnings.catch_warnings():
        # DCP warns on every single-process call that it assumes one process: that is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            yield
        except CheckpointException as exc:
            # every rank gets every rank's failures, so all of them raise the same type: a damaged
            # checkpoint (which recovery may fall back from) on all ranks, or another failure on all
            failures = sorted((rank, failure) for rank, (failure, _) in exc.failures.items())
            integrity = [(rank, f) for rank, f in failures if isinstance(f, CheckpointIntegrityError)]
            rank, first = (integrity or failures)[0]
            message = (
                f"{what} failed on rank(s) {[r for r, _ in failures]}; rank {rank}: {type(first).__name__}: {first}"
            )
            if not integrity:
                raise CheckpointError(message) from first
            error = CheckpointIntegrityError(message)
            error.file, error.item = first.file, first.item
            raise error from first


def dcp_save(state: dict[str, Any], writer: StorageDCPWriter, process_group: Any, distributed: bool) -> None:
    """``dcp.save`` of ``state`` through ``writer`` over ``process_group`` (or in one process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    with dcp_call(f"saving {writer.checkpoints.url_for(writer.step_dir)}"):
        dcp.save(
            state,
            storage_writer=writer,
            planner=DefaultSavePlanner(),
            process_group=process_group,
            no_dist=not distributed,
        )
