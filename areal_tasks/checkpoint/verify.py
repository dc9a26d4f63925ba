"""Checking a checkpoint against the hashes its save recorded, before anything in it is used.

A save records, in ``metadata.json``, every file with its size and sha256 (a data file: the sha256 over
its items' digests), and in ``_COMPLETE`` the sha256 of ``metadata.json`` itself; ``dcp/index.json``
holds each item's sha256. This module reads them back:

* :func:`read_metadata`: ``metadata.json`` checked against ``_COMPLETE`` (size-capped, parsed without
  tracebacks), the root of every other check.
* :func:`read_verified` / :func:`read_verified_json`: one file checked against ``metadata.json``
  before the loader applies it (``engines.json``, ``trainer_state.json``, ``rng/*``, the HF sidecar).
* :func:`verify_step`: a whole checkpoint. *Cheap* (what ``areal checkpoint list`` runs): the marker
  and metadata hashes, every recorded file present with its recorded size (referenced files of
  other step directories too), and the hashes of the small state files (``engines.json``,
  ``trainer_state.json``, ``dcp/index.json``). *Deep* (``areal checkpoint verify``, ``list
  --verify``): also every other file's hash and every item's sha256, wherever its bytes are, hashed
  by a few read threads (hashlib releases the GIL) with bounded memory.

Damage is a :class:`~areal_tasks.errors.CheckpointIntegrityError` (or a :class:`Problem` in a
report) naming the file and, for tensor data, the item. Storage failures (an unreachable server)
stay storage errors: they say nothing about the checkpoint. Torch-free except the deep item check.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_tasks.checkpoint.layout import (
    COMPLETE_MARKER,
    DCP_INDEX,
    ENGINES_FILE,
    HF_DIR,
    METADATA_FILE,
    QUARANTINE_MARKER,
    TRAINER_STATE_FILE,
    CheckpointLayout,
    step_dir,
)
from areal_tasks.checkpoint.metadata import (
    MAX_METADATA_BYTES,
    CheckpointMetadata,
    check_bytes,
    damaged,
    load_json,
    sha256_hex,
)
from areal_tasks.errors import CheckpointError, CheckpointIntegrityError
from storage.errors import StorageNotFoundError

if TYPE_CHECKING:
    from areal_tasks.checkpoint.dcp_index import ItemRecord
    from storage import Storage

logger = logging.getLogger(__name__)

#: files whose hash the cheap check reads (small, and what a resume applies first).
STATE_FILES = (ENGINES_FILE, TRAINER_STATE_FILE, DCP_INDEX)


@dataclass(frozen=True)
class Problem:
    """One piece of damage: the file's URL, the item (a DCP item's name) when known, the message."""

    file: str
    item: str | None
    message: str

    @classmethod
    def of(cls, exc: CheckpointIntegrityError) -> Problem:
        return cls(exc.file or "", exc.item, str(exc))

    def __str__(self) -> str:
        return self.message

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "item": self.item, "problem": self.message}


@dataclass
class VerifyReport:
    """What :func:`verify_step` found."""

    step: int
    deep: bool
    problems: list[Problem] = field(default_factory=list)
    metadata: CheckpointMetadata | None = None
    files_checked: int = 0
    items_checked: int = 0
    bytes_hashed: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_damaged(self) -> None:
        """Raise a :class:`CheckpointIntegrityError` with the first problem (and how many more)."""
        if self.ok:
            return
        first = self.problems[0]
        more = f" (and {len(self.problems) - 1} more problems)" if len(self.problems) > 1 else ""
        error = CheckpointIntegrityError(f"checkpoint {step_dir(self.step)} is damaged: {first}{more}")
        error.file, error.item = first.file, first.item
        raise error


def _read(storage: Storage, key: str, limit: int | None = None) -> bytes:
    """The bytes of ``key``; missing (or, with ``limit``, oversized) is damage, other failures are
    storage errors."""
    url = storage.url_for(key)
    try:
        if limit is not None:
            size = storage.size(key)
            if size > limit:
                raise damaged(url, f"is {size} bytes, more than such a file can be ({limit}): damaged")
        return storage.read_bytes(key)
    except StorageNotFoundError as exc:
        raise damaged(url, "is missing") from exc


def read_marker(layout: CheckpointLayout, step: int) -> dict[str, Any]:
    """The ``_COMPLETE`` payload of ``step`` (of a quarantined step: the copy its quarantine kept)."""
    storage = layout.storage
    key = layout.key(step, COMPLETE_MARKER)
    if storage.exists(key):
        marker = load_json(_read(storage, key, MAX_METADATA_BYTES), layout.url(key))
    else:
        quarantined = layout.key(step, QUARANTINE_MARKER)
        if not storage.exists(quarantined):
            raise CheckpointError(f"{layout.url(step_dir(step))} is not a complete checkpoint")
        record = load_json(_read(storage, quarantined, MAX_METADATA_BYTES), layout.url(quarantined))
        text = record.get("complete") if isinstance(record, dict) else None
        marker = load_json(text, layout.url(quarantined)) if isinstance(text, str) else {}
    if not isinstance(marker, dict):
        raise damaged(layout.url(key), f"must hold a JSON object, got {type(marker).__name__}")
    return marker


def read_metadata(layout: CheckpointLayout, step: int, *, verify: bool = True) -> CheckpointMetadata:
    """``metadata.json`` of ``step``, checked (``verify``) against the sha256 ``_COMPLETE`` records."""
    marker = read_marker(layout, step)
    key = layout.key(step, METADATA_FILE)
    url = layout.url(key)
    data = _read(layout.storage, key, MAX_METADATA_BYTES)
    expected = marker.get("metadata_sha256")
    if verify and expected is not None and sha256_hex(data) != expected:
        raise damaged(url, f"fails its sha256 check against {COMPLETE_MARKER} (edited or damaged)")
    metadata = CheckpointMetadata.from_json(data, url)
    if metadata.step != step:
        raise damaged(url, f"describes step {metadata.step}, not {step}")
    return metadata


def read_verified(
    layout: CheckpointLayout, step: int, rel: str, metadata: CheckpointMetadata, *, verify: bool = True
) -> bytes:
    """The bytes of ``rel`` in ``step``, checked (``verify``) against ``metadata.json``'s record."""
    key = layout.key(step, rel)
    data = _read(layout.storage, key)
    if verify:
        info = metadata.files.get(rel)
        if info is None:
            raise damaged(layout.url(key), f"is not recorded in {METADATA_FILE}")
        check_bytes(data, info, layout.url(key))
    return data


def read_verified_json(
    layout: CheckpointLayout, step: int, rel: str, metadata: CheckpointMetadata, *, verify: bool = True
) -> Any:
    """:func:`read_verified`, parsed as JSON (damage named, never a traceback)."""
    return load_json(read_verified(layout, step, rel, metadata, verify=verify), layout.url(layout.key(step, rel)))


def _is_data_file(rel: str) -> bool:
    return rel.startswith("dcp/") and rel.endswith(".distcp")


def verify_step(layout: CheckpointLayout, step: int, *, deep: bool = False) -> VerifyReport:
    """Check checkpoint ``step`` (cheap or ``deep``, see the module docstring); never raises for damage."""
    report = VerifyReport(step, deep)
    try:
        report.metadata = metadata = read_metadata(layout, step)
    except CheckpointIntegrityError as exc:
        report.problems.append(Problem.of(exc))
        return report
    listing = layout.files(step)
    for rel, info in sorted(metadata.files.items()):
        url = layout.url(layout.key(step, rel))
        report.files_checked += 1
        if rel not in listing:
            report.problems.append(Problem.of(damaged(url, "is missing")))
        elif listing[rel] != info.size:
            report.problems.append(
                Problem.of(damaged(url, f"holds {listing[rel]} bytes; {METADATA_FILE} records {info.size}"))
            )
        elif rel in STATE_FILES or (deep and not _is_data_file(rel)):
            try:
                read_verified(layout, step, rel, metadata)
                report.bytes_hashed += info.size
            except CheckpointIntegrityError as exc:
                report.problems.append(Problem.of(exc))
    _check_references(layout, step, metadata, report)
    if deep and not any(p.file.endswith(DCP_INDEX) for p in report.problems):
        _verify_data(layout, step, metadata, report)
    return report


def _check_references(layout: CheckpointLayout, step: int, metadata: CheckpointMetadata, report: VerifyReport) -> None:
    """Every file of another step directory that ``step`` reads is there."""
    storage = layout.storage
    for directory, files in sorted(metadata.references.items()):
        present = storage.walk_files(directory) if storage.exists(directory) else {}
        for rel in files:
            if rel not in present:
                url = layout.url(f"{directory}/{rel}")
                report.problems.append(Problem.of(damaged(url, f"is missing (checkpoint {step_dir(step)} reads it)")))


def _verify_data(layout: CheckpointLayout, step: int, metadata: CheckpointMetadata, report: VerifyReport) -> None:
    """Every item's sha256 (wherever its bytes are) and each own data file's digest over its items."""
    from areal_tasks.checkpoint.dcp_index import records_of
    from areal_tasks.checkpoint.dcp_read import READ_THREADS, read_index, read_spans

    storage = layout.storage
    own = step_dir(step)
    try:
        records = records_of(read_index(storage, own, metadata.files.get(DCP_INDEX)))
    except CheckpointIntegrityError as exc:
        report.problems.append(Problem.of(exc))
        return
    per_file: dict[str, list[tuple[None, ItemRecord]]] = {}
    for record in records:
        per_file.setdefault(f"{record.dir}/{record.file}", []).append((None, record))
    spans = [
        (key, start, end, group) for key, reqs in sorted(per_file.items()) for start, end, group in read_spans(reqs)
    ]
    with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="ckpt-verify") as pool:
        results = [
            pool.submit(_check_span, storage, key, start, end, [r for _, r in g]) for key, start, end, g in spans
        ]
        for future in results:
            problems, items, nbytes = future.result()
            report.problems.extend(problems)
            report.items_checked += items
            report.bytes_hashed += nbytes
    written: dict[str, list[ItemRecord]] = {}
    for record in records:
        if record.dir == own:
            written.setdefault(record.file, []).append(record)
    for rel, info in sorted(metadata.files.items()):
        if _is_data_file(rel):
            mine = sorted(written.get(rel, []), key=lambda r: r.pos)
            if _file_digest(r.sha256 for r in mine) != info.sha256:
                url = layout.url(layout.key(step, rel))
                report.problems.append(Problem.of(damaged(url, "does not match its item records in the index")))


def _check_span(
    storage: Storage, key: str, start: int, end: int, records: list[ItemRecord]
) -> tuple[list[Problem], int, int]:
    """(problems, items checked, bytes hashed) of one span of one file: runs on a verify thread."""
    from areal_tasks.checkpoint.dcp_read import fetch_range, item_digests, item_failure

    try:
        data = fetch_range(storage, key, start, end)
    except CheckpointIntegrityError as exc:
        return [Problem.of(exc)], 0, 0
    problems = [
        Problem.of(item_failure(storage, record, digest))
        for record, digest in zip(records, item_digests(data, start, records), strict=True)
        if digest != record.sha256
    ]
    return problems, len(records), len(data)


def _file_digest(item_digests: Iterable[str]) -> str:
    """A data file's digest as the writer records it: sha256 over its items' digests in file order."""
    digest = hashlib.sha256()
    for item in item_digests:
        digest.update(bytes.fromhex(item))
    return digest.hexdigest()


def sidecar_files(metadata: CheckpointMetadata, engine: str) -> list[str]:
    """The HF sidecar files of ``engine`` that ``metadata.json`` records (relative to the step)."""
    prefix = f"{HF_DIR}/{engine}/"
    return sorted(rel for rel in metadata.files if rel.startswith(prefix))
