"""Reading torch.distributed.checkpoint data through :class:`storage.Storage`, checking it as it goes.

:class:`StorageDCPReader` is DCP's ``StorageReader`` for what :mod:`areal_tasks.checkpoint.dcp_io`
writes. It resolves item records wherever they point (this step directory, or an earlier one for
bytes an incremental save reused), coalesces nearby items of one file into ranged reads of at most
``MAX_READ_SPAN`` bytes fetched by a few threads (bounded memory), and by default checks every
item's sha256 in those threads (hashlib releases the GIL, so the check overlaps the reads instead
of holding up the main thread). :func:`read_index` reads ``dcp/index.json`` checked against the
hash ``metadata.json`` records and against the layout the loader relies on. Non-tensor items are
unpickled with ``weights_only=True`` (:class:`SafeLoadPlanner`). A missing, short or altered file
is a :class:`~areal_tasks.errors.CheckpointIntegrityError` naming the file and the item.
"""

from __future__ import annotations

import hashlib
import io
import logging
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.distributed.checkpoint import LoadPlan, LoadPlanner, StorageReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from areal_tasks.checkpoint.dcp_index import ItemRecord, dtype_of, metadata_from_json, validate_index
from areal_tasks.checkpoint.dcp_io import ALIGN, dcp_call
from areal_tasks.checkpoint.layout import DCP_INDEX
from areal_tasks.checkpoint.metadata import FileInfo, check_bytes, damaged, load_json
from areal_tasks.errors import CheckpointError, CheckpointIntegrityError
from storage.errors import StorageNotFoundError

if TYPE_CHECKING:
    from storage import Storage

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: the largest byte range the reader fetches in one request (several small items share one).
MAX_READ_SPAN = 64 * 2**20
#: ranged reads in flight at once (memory bound: READ_THREADS * MAX_READ_SPAN).
READ_THREADS = 4


def dcp_load(
    state: dict[str, Any], reader: StorageDCPReader, process_group: Any, distributed: bool, *, partial: bool = False
) -> None:
    """``dcp.load`` into ``state`` through ``reader`` (``partial``: ``state`` may hold a subset of the items)."""
    import torch.distributed.checkpoint as dcp

    with dcp_call(f"loading {reader.checkpoints.url_for(reader.step_dir)}"):
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
