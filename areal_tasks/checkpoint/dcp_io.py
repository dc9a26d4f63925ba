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

The reader resolves records wherever they point, coalesces nearby items of one file into ranged
reads of at most ``MAX_READ_SPAN`` bytes fetched by a few threads (bounded memory), and by default
verifies every item's sha256 in those threads (hashlib releases the GIL, so the check overlaps the
reads instead of holding up the main thread) and the index against the hash ``metadata.json``
records. Non-tensor items are unpickled with ``weights_only=True`` (:class:`SafeLoadPlanner`).
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
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import torch
from torch.distributed.checkpoint import LoadPlan, LoadPlanner, SavePlan, SavePlanner, StorageReader, StorageWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem
from torch.distributed.checkpoint.storage import WriteResult

from areal_tasks.checkpoint.dcp_index import (
    ItemRecord,
    dtype_name,
    dtype_of,
    index_to_json,
    metadata_from_json,
    validate_index,
)
from areal_tasks.checkpoint.layout import DCP_INDEX, dcp_data_file
from areal_tasks.checkpoint.metadata import FileInfo, check_bytes, damaged, load_json, sha256_hex
from areal_tasks.errors import CheckpointError, CheckpointIntegrityError
from storage.errors import StorageNotFoundError

if TYPE_CHECKING:
    from areal_tasks.checkpoint.incremental import ParentIndex
    from storage import Storage

logger = logging.getLogger(__name__)

T = TypeVar("T")

ALIGN = 64
#: the largest byte range the reader fetches in one request (several small items share one).
MAX_READ_SPAN = 64 * 2**20
#: items hashed ahead of the one being written (each holds a host copy only for device tensors).
HASH_AHEAD = 2
#: ranged reads in flight at once (memory bound: READ_THREADS * MAX_READ_SPAN).
READ_THREADS = 4


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
def _dcp_call(what: str) -> Iterator[None]:
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

    with _dcp_call(f"saving {writer.checkpoints.url_for(writer.step_dir)}"):
        dcp.save(
            state,
            storage_writer=writer,
            planner=DefaultSavePlanner(),
            process_group=process_group,
            no_dist=not distributed,
        )


def dcp_load(
    state: dict[str, Any], reader: StorageDCPReader, process_group: Any, distributed: bool, *, partial: bool = False
) -> None:
    """``dcp.load`` into ``state`` through ``reader`` (``partial``: ``state`` may hold a subset of the items)."""
    import torch.distributed.checkpoint as dcp

    with _dcp_call(f"loading {reader.checkpoints.url_for(reader.step_dir)}"):
        dcp.load(
            state,
            storage_reader=reader,
            planner=SafeLoadPlanner(allow_partial_load=partial),
            process_group=process_group,
            no_dist=not distributed,
        )


def read_index(checkpoints: Storage, step_dir: str, expected: FileInfo | None = None) -> dict[str, Any]:
    """The parsed ``dcp/index.json`` of ``step_dir``, its layout checked; with ``expected`` (its entry
    in ``metadata.json``) its bytes are checked against the recorded size and sha256 first."""
    key = f"{step_dir}/{DCP_INDEX}"
    url = checkpoints.url_for(key)
    try:
        data = checkpoints.read_bytes(key)
    except StorageNotFoundError as exc:
        raise damaged(url, "is missing") from exc
    if expected is not None:
        check_bytes(data, expected, url)
    index = load_json(data, url)
    validate_index(index, url)
    return index


def fetch_range(storage: Storage, key: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the file ``key``; a missing or short file is a damaged checkpoint."""
    path = storage.fs_path(key)
    try:
        data = storage.run("read", key, lambda: storage.fs.cat_file(path, start=start, end=end))
    except StorageNotFoundError as exc:
        raise damaged(storage.url_for(key), "is missing") from exc
    if len(data) != end - start:
        raise damaged(storage.url_for(key), f"is truncated: expected {end - start} bytes at {start}, got {len(data)}")
    return data


def item_digests(buffer: bytes, start: int, records: list[ItemRecord]) -> list[str]:
    """The sha256 of each record's bytes in ``buffer`` (which holds the file from ``start`` on)."""
    view = memoryview(buffer)
    return [hashlib.sha256(view[r.pos - start : r.pos - start + r.length]).hexdigest() for r in records]


def item_failure(storage: Storage, record: ItemRecord, digest: str) -> CheckpointIntegrityError:
    """The error for an item whose bytes hash to ``digest`` instead of its recorded sha256."""
    return damaged(
        storage.url_for(f"{record.dir}/{record.file}"),
        f"fails its sha256 check (got {digest[:12]}..., the index records {record.sha256[:12]}...)",
        item=record.fqn,
    )


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor items are unpickled with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._nested_dict import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def read_spans(reqs: list[tuple[T, ItemRecord]]) -> Iterator[tuple[int, int, list[tuple[T, ItemRecord]]]]:
    """Coalesce requests of one file (sorted by position) into (start, end, requests) spans of at most
    MAX_READ_SPAN bytes."""
    group: list[tuple[T, ItemRecord]] = []
    start = end = 0
    for req, rec in sorted(reqs, key=lambda pair: pair[1].pos):
        rec_end = rec.pos + rec.length
        if group and rec.pos <= end + ALIGN * 16 and rec_end - start <= MAX_READ_SPAN:
            group.append((req, rec))
            end = max(end, rec_end)
            continue
        if group:
            yield start, end, group
        group, start, end = [(req, rec)], rec.pos, rec_end
    if group:
        yield start, end, group


class StorageDCPReader(StorageReader):
    """DCP ``StorageReader`` of ``<checkpoints>/<step_dir>/`` that follows references (module docstring).

    ``verify`` (default): every item read is checked against its sha256 and, given
    ``expected_index`` (the index's entry in ``metadata.json``), the index against its recorded hash;
    a mismatch is a :class:`CheckpointIntegrityError` naming the file and the item. ``index``: the
    index already read (:func:`read_index`); callers pass it so that a damaged index raises before
    DCP starts (DCP reports a failed metadata read as a bare assertion, losing the error's type).
    """

    def __init__(
        self,
        checkpoints: Storage,
        step_dir: str,
        *,
        verify: bool = True,
        expected_index: FileInfo | None = None,
        index: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.checkpoints = checkpoints
        self.step_dir = step_dir
        self.verify = verify
        self.expected_index = expected_index if verify else None
        self.index = index
        self.records: dict[Any, ItemRecord] = {}
        self.bytes_read = 0

    def reset(self, checkpoint_id: Any = None) -> None:
        self.records = {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False

    def read_metadata(self) -> Metadata:
        index = (
            self.index if self.index is not None else read_index(self.checkpoints, self.step_dir, self.expected_index)
        )
        return metadata_from_json(index)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.records = dict(metadata.storage_data)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _fetch(
        self, key: str, start: int, end: int, group: list[tuple[ReadItem, ItemRecord]]
    ) -> tuple[bytes, list[str] | None]:
        """(bytes of the span, each item's sha256 when verifying): runs on a read thread."""
        data = fetch_range(self.checkpoints, key, start, end)
        return data, item_digests(data, start, [rec for _, rec in group]) if self.verify else None

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        per_file: dict[str, list[tuple[ReadItem, ItemRecord]]] = {}
        for req in plan.items:
            record = self.records[req.storage_index]
            per_file.setdefault(f"{record.dir}/{record.file}", []).append((req, record))
        spans = [
            (key, start, end, group) for key, reqs in sorted(per_file.items()) for start, end, group in read_spans(reqs)
        ]
        with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="dcp-read") as pool:
            pending: list[tuple[Future[tuple[bytes, list[str] | None]], int, list[tuple[ReadItem, ItemRecord]]]] = []
            for key, start, end, group in spans:
                pending.append((pool.submit(self._fetch, key, start, end, group), start, group))
                if len(pending) >= READ_THREADS:
                    self._apply(planner, *pending.pop(0))
            while pending:
                self._apply(planner, *pending.pop(0))
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _apply(
        self,
        planner: LoadPlanner,
        fetched: Future[tuple[bytes, list[str] | None]],
        start: int,
        group: list[tuple[ReadItem, ItemRecord]],
    ) -> None:
        from torch.distributed._shard._utils import narrow_tensor_by_index

        buffer, digests = fetched.result()
        self.bytes_read += len(buffer)
        view = memoryview(buffer)
        for number, (req, rec) in enumerate(group):
            if digests is not None and digests[number] != rec.sha256:
                raise item_failure(self.checkpoints, rec, digests[number])
            chunk = view[rec.pos - start : rec.pos - start + rec.length]
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(chunk.tobytes()))
                continue
            dtype = dtype_of(rec.dtype or "")
            if rec.length:
                with warnings.catch_warnings():  # read-only bytes: the tensor is only copied from, never written
                    warnings.filterwarnings("ignore", message="The given buffer is not writable")
                    tensor = torch.frombuffer(buffer, dtype=torch.uint8, offset=rec.pos - start, count=rec.length)
                tensor = tensor.view(dtype).reshape(rec.shape or ())
            else:
                tensor = torch.empty(rec.shape or (), dtype=dtype)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise CheckpointError(
                    f"item {rec.fqn!r}: stored shard {tuple(tensor.size())} != target {tuple(target.size())}"
                )
            target.copy_(tensor)
            planner.commit_tensor(req, target)
