"""One save, in two phases.

:func:`prepare_save` (the trainer waits for it, on every rank): collect the engines' sharded state
(a host copy when the save is async), this rank's RNG states, and -- on rank 0 -- the small JSON
pieces. :func:`write_checkpoint` (inline, or on the background thread): every rank writes its DCP
data file and RNG file; rank 0 writes the DCP index, ``trainer_state.json``, ``engines.json``, the
HF sidecars, ``metadata.json``, then ``_COMPLETE``, then the ``latest`` pointer. A kill anywhere
before ``_COMPLETE`` leaves a directory readers ignore.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from areal_tasks.api.faults import fault_point
from areal_tasks.api.train_engine import CheckpointableEngine
from areal_tasks.checkpoint.async_save import stage_state_dict
from areal_tasks.checkpoint.dcp_io import StorageDCPWriter
from areal_tasks.checkpoint.group import CheckpointGroup
from areal_tasks.checkpoint.incremental import ParentIndex, references_of
from areal_tasks.checkpoint.layout import (
    DCP_INDEX,
    ENGINES_FILE,
    METADATA_FILE,
    TRAINER_STATE_FILE,
    CheckpointLayout,
    rng_file,
    step_dir,
    utc_now,
)
from areal_tasks.checkpoint.metadata import ByteCounts, CheckpointMetadata, FileInfo, json_file, sha256_hex
from areal_tasks.checkpoint.rng import capture_rng_state
from areal_tasks.checkpoint.state import TrainerState, engine_side_state, sharded_state_dict

logger = logging.getLogger(__name__)


@dataclass
class SaveRequest:
    """Everything one save writes, captured at the moment :func:`prepare_save` ran."""

    step: int
    state: dict[str, Any]
    rng: dict[str, Any]
    trainer_state: dict[str, Any]
    engines: dict[str, dict[str, Any]]
    #: engine name -> {file name: bytes} of the HF sidecar (config, tokenizer); rank 0 only.
    sidecars: dict[str, dict[str, bytes]]
    metrics: dict[str, float]
    config: dict[str, Any] | None
    config_hash: str | None
    parent: int | None
    incremental: bool
    created_at: str = field(default_factory=utc_now)
    stage_seconds: float = 0.0


def prepare_save(
    group: CheckpointGroup,
    step: int,
    engines: Mapping[str, CheckpointableEngine],
    trainer_state: TrainerState,
    metrics: Mapping[str, float],
    config: tuple[dict[str, Any] | None, str | None],
    *,
    parent: int | None,
    incremental: bool,
    stage: bool,
) -> SaveRequest:
    """Phase 1 (blocking the trainer): capture the state; ``stage`` copies tensors to host memory."""
    start = time.perf_counter()
    created = utc_now()
    state = sharded_state_dict(engines)
    if stage:
        state = stage_state_dict(state)
    sidecars = {name: engine.hf_sidecar_files() for name, engine in engines.items()} if group.is_coordinator else {}
    request = SaveRequest(
        step=step,
        state=state,
        rng=capture_rng_state(),
        trainer_state=trainer_state.to_dict(),
        engines=engine_side_state(engines),
        sidecars=sidecars,
        metrics={k: float(v) for k, v in metrics.items()},
        config=config[0],
        config_hash=config[1],
        parent=parent,
        incremental=incremental,
        created_at=created,
    )
    request.stage_seconds = time.perf_counter() - start
    return request


def write_checkpoint(layout: CheckpointLayout, group: CheckpointGroup, request: SaveRequest) -> CheckpointMetadata:
    """Phase 2 (every rank): write the data, then rank 0 commits; returns the metadata on every rank."""
    from areal_tasks.checkpoint.dcp_io import dcp_save

    start = time.perf_counter()
    directory = step_dir(request.step)
    storage = layout.storage
    parent_index = None
    if request.incremental and request.parent is not None:
        parent_index = ParentIndex.load(storage, step_dir(request.parent))
    writer = StorageDCPWriter(storage, directory, parent_index)
    dcp_save(request.state, writer, group.pg, group.distributed)
    rng_bytes, rng_info = json_file(request.rng)
    storage.write_bytes(f"{directory}/{rng_file(group.rank)}", rng_bytes)
    stats = writer.stats
    local = {
        "files": {**stats.files, rng_file(group.rank): rng_info},
        "written": stats.written + rng_info.size,
        "referenced": stats.referenced,
        "logical": stats.logical,
    }
    gathered = group.all_gather(local)
    write_seconds = time.perf_counter() - start

    def commit() -> CheckpointMetadata:
        return _commit(layout, group, request, writer, gathered, write_seconds)

    metadata = group.on_coordinator(commit, f"committing checkpoint step {request.step}")
    logger.info(
        "saved checkpoint %s: %d bytes written, %d referenced (stage %.2fs, write %.2fs)",
        layout.url(directory),
        metadata.sizes.written,
        metadata.sizes.referenced,
        request.stage_seconds,
        write_seconds,
    )
    return metadata


def _commit(
    layout: CheckpointLayout,
    group: CheckpointGroup,
    request: SaveRequest,
    writer: StorageDCPWriter,
    gathered: list[dict[str, Any]],
    write_seconds: float,
) -> CheckpointMetadata:
    """Rank 0: side files, metadata, ``_COMPLETE``, ``latest``."""
    storage = layout.storage
    directory = step_dir(request.step)
    files: dict[str, FileInfo] = {}
    written = 0
    for per_rank in gathered:
        files.update(per_rank["files"])
        written += per_rank["written"]
    if writer.index_file is None:
        raise RuntimeError("the DCP writer's finish() did not run on the coordinator")
    files[DCP_INDEX] = writer.index_file
    written += writer.index_file.size
    side: dict[str, Any] = {TRAINER_STATE_FILE: request.trainer_state, ENGINES_FILE: request.engines}
    for name, payload in side.items():
        data, info = json_file(payload)
        storage.write_bytes(f"{directory}/{name}", data)
        files[name] = info
        written += info.size
    for engine, sidecar in request.sidecars.items():
        for name, data in sidecar.items():
            rel = f"hf/{engine}/{name}"
            storage.write_bytes(f"{directory}/{rel}", data)
            files[rel] = FileInfo(size=len(data), sha256=sha256_hex(data))
            written += len(data)
    records = writer.records
    first = next(iter(request.engines.values()), {})
    metadata = CheckpointMetadata(
        step=request.step,
        epoch=int(request.trainer_state.get("epoch", 0)),
        version=int(request.trainer_state.get("version", first.get("version", 0))),
        world_size=group.world_size,
        created_at=request.created_at,
        timings={"stage": request.stage_seconds, "write": write_seconds},
        config_hash=request.config_hash,
        config=request.config,
        metrics=request.metrics,
        parent=request.parent if request.incremental else None,
        incremental=request.incremental,
        engines={
            name: {k: v for k, v in entry.items() if k != "lr_scheduler"} for name, entry in request.engines.items()
        },
        references=references_of(records, directory),
        sizes=ByteCounts(
            logical=sum(p["logical"] for p in gathered),
            written=written,
            referenced=sum(p["referenced"] for p in gathered),
        ),
        files=files,
    )
    metadata.completed_at = utc_now()
    metadata.timings["total"] = request.stage_seconds + write_seconds
    meta_bytes = metadata.to_json().encode("utf-8")
    storage.write_bytes(f"{directory}/{METADATA_FILE}", meta_bytes)
    fault_point("checkpoint.save.before_complete", step=request.step)
    layout.write_complete(
        request.step,
        {"step": request.step, "completed_at": metadata.completed_at, "metadata_sha256": sha256_hex(meta_bytes)},
    )
    layout.write_latest_pointer(request.step)
    return metadata
