"""Loading one checkpoint into engines, every piece checked before any of it is applied.

Order (collective; every rank calls :func:`load_step`):

1. rank 0 reads ``metadata.json`` (checked against ``_COMPLETE``), ``engines.json``,
   ``trainer_state.json`` and ``dcp/index.json`` (checked against ``metadata.json``; the index's
   layout too) and hands them to every rank (DCP itself would read the index on rank 0 alone);
2. each rank reads its own ``rng/rank-<r>.json`` (checked); every rank learns whether any failed;
3. DCP loads the tensors through :class:`~areal_tasks.checkpoint.dcp_read.StorageDCPReader`, which
   checks each item against its sha256 on its read threads (DCP hands every rank's failure to
   every rank);
4. only then are the engines' state, their JSON side state and the RNGs restored.

A failure at any step raises on every rank together, so no rank waits in a collective the others
left; damage is a :class:`~areal_tasks.errors.CheckpointIntegrityError` (what recovery falls back
from), anything else a plain :class:`~areal_tasks.errors.CheckpointError` or a storage error. With
``verify=False`` no hash is compared (the files are still parsed safely).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from areal_tasks.api.train_engine import CheckpointableEngine
from areal_tasks.checkpoint.group import CheckpointGroup
from areal_tasks.checkpoint.layout import DCP_INDEX, ENGINES_FILE, TRAINER_STATE_FILE, rng_file, step_dir
from areal_tasks.checkpoint.metadata import CheckpointMetadata, damaged
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.checkpoint.verify import read_metadata, read_verified_json
from areal_tasks.errors import CheckpointError

if TYPE_CHECKING:
    from areal_tasks.checkpoint.layout import CheckpointLayout

logger = logging.getLogger(__name__)


def load_step(
    layout: CheckpointLayout,
    group: CheckpointGroup,
    step: int,
    engines: Mapping[str, CheckpointableEngine],
    *,
    verify: bool = True,
) -> TrainerState:
    """Restore checkpoint ``step`` into ``engines`` and this rank's RNGs (see the module docstring)."""
    from areal_tasks.checkpoint.dcp_read import StorageDCPReader, dcp_load
    from areal_tasks.checkpoint.rng import restore_rng_state
    from areal_tasks.checkpoint.state import apply_sharded_state_dict, restore_engine_side_state, sharded_state_dict

    metadata, side, trainer, index = group.on_coordinator(
        lambda: _read_side_files(layout, step, verify), f"reading checkpoint step {step}"
    )
    rng = _read_rng(layout, group, step, metadata, verify)
    state = sharded_state_dict(engines)
    reader = StorageDCPReader(layout.storage, step_dir(step), verify=verify, index=index)
    dcp_load(state, reader, group.pg, group.distributed)
    apply_sharded_state_dict(engines, state)
    restore_engine_side_state(engines, side)
    if rng is not None:
        restore_rng_state(rng)
    else:
        logger.warning(
            "checkpoint was saved by %d ranks, this run has %d: RNG states are not restored "
            "(the run continues, but not bit-identically)",
            metadata.world_size,
            group.world_size,
        )
    group.barrier()
    logger.info(
        "loaded checkpoint %s (%d bytes read by this rank, %s)",
        layout.url(step_dir(step)),
        reader.bytes_read,
        "every item's sha256 checked" if verify else "hashes not checked: recover.verify is off",
    )
    return TrainerState.from_dict(trainer)


def _read_side_files(
    layout: CheckpointLayout, step: int, verify: bool
) -> tuple[CheckpointMetadata, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Rank 0: (metadata, engines.json, trainer_state.json, dcp/index.json), each checked."""
    from areal_tasks.checkpoint.dcp_read import read_index

    metadata = read_metadata(layout, step, verify=verify)
    out = []
    for rel in (ENGINES_FILE, TRAINER_STATE_FILE):
        payload = read_verified_json(layout, step, rel, metadata, verify=verify)
        if not isinstance(payload, dict):
            raise damaged(layout.url(layout.key(step, rel)), "must hold a JSON object")
        out.append(payload)
    index = read_index(layout.storage, step_dir(step), metadata.files.get(DCP_INDEX) if verify else None)
    return metadata, out[0], out[1], index


def _read_rng(
    layout: CheckpointLayout, group: CheckpointGroup, step: int, metadata: CheckpointMetadata, verify: bool
) -> dict[str, Any] | None:
    """This rank's checked RNG state, or None when the world size changed (then none is restored)."""
    if metadata.world_size != group.world_size:
        return None
    rel = rng_file(group.rank)
    state: Any = None
    failure: Exception | None = None
    try:
        state = read_verified_json(layout, step, rel, metadata, verify=verify)
        if not isinstance(state, dict):
            raise damaged(layout.url(layout.key(step, rel)), "must hold a JSON object")
    except Exception as exc:  # noqa: BLE001 - shared with every rank below, then raised on all of them
        failure = exc
    if failure is None or isinstance(failure, CheckpointError):
        shared: CheckpointError | None = failure
    else:
        shared = CheckpointError(
            f"reading {layout.url(layout.key(step, rel))} failed on rank {group.rank}: "
            f"{type(failure).__name__}: {failure}"
        )
    first = next((found for found in group.all_gather(shared) if found is not None), None)
    if first is not None:
        raise first from failure
    return state
