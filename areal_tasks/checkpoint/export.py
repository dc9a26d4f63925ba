"""HF export of a DCP checkpoint: a model directory that plain ``transformers`` loads.

At save time every checkpoint gets a small HF sidecar per engine (``hf/<engine>/config.json`` and
the tokenizer files of the model it was built from: the engine's ``hf_sidecar_files()``). Export
then needs no engine and no process group: the engine's model tensors are read from the DCP data
(shards reassembled into full tensors by DCP's resharding), LoRA adapters are merged into the base
weights (``W0 + s * B @ A``, the same code the engine's own HF save uses), a tied LM head is
dropped, and the directory is written atomically with the engine's HF writer
(:func:`areal_tasks.models.hf_dir.write_hf_dir`, the one writer of HF directories; the sidecar uses
its config clean-up and tokenizer file list) -- so the export equals ``engine.save(path, "hf")``.

Nothing damaged is exported: ``metadata.json``, ``engines.json``, the index, the sidecar and every
tensor item read are checked against the hashes the save recorded. Nothing of the user's is
destroyed: the output directory must be new or empty, or (``force``) the export replaces only
what an earlier export wrote there (:mod:`storage.ownership`).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.checkpoint.layout import DCP_INDEX, ENGINES_FILE, HF_DIR, CheckpointLayout, step_dir
from areal_tasks.checkpoint.metadata import CheckpointMetadata
from areal_tasks.checkpoint.state import ENGINES_KEY
from areal_tasks.checkpoint.verify import read_metadata, read_verified, read_verified_json, sidecar_files
from areal_tasks.errors import CheckpointError
from storage.errors import StorageError
from storage.ownership import OnExists, check_target

if TYPE_CHECKING:
    import torch

    from storage import Storage

logger = logging.getLogger(__name__)


def read_engine_tensors(
    checkpoints: Storage, step: int, engine: str, *, verify: bool = True
) -> dict[str, torch.Tensor]:
    """The full model tensors of ``engine`` in checkpoint ``step`` (state-dict names), in one process;
    with ``verify`` the index and every item read are checked against their recorded hashes."""
    import torch

    from areal_tasks.checkpoint.dcp_index import dtype_of
    from areal_tasks.checkpoint.dcp_read import StorageDCPReader, dcp_load, read_index

    layout = CheckpointLayout(checkpoints)
    directory = step_dir(step)
    expected = read_metadata(layout, step).files.get(DCP_INDEX) if verify else None
    index = read_index(checkpoints, directory, expected)
    prefix = f"{ENGINES_KEY}.{engine}.model."
    state = {
        fqn: torch.empty(entry["size"], dtype=dtype_of(entry["dtype"]))
        for fqn, entry in index["state_dict"].items()
        if fqn.startswith(prefix) and entry["type"] == "tensor"
    }
    if not state:
        engines = sorted({fqn.split(".")[1] for fqn in index["state_dict"] if fqn.startswith(f"{ENGINES_KEY}.")})
        raise CheckpointError(
            f"checkpoint {checkpoints.url_for(directory)} holds no engine {engine!r}; it has {engines}"
        )
    reader = StorageDCPReader(checkpoints, directory, verify=verify, index=index)
    dcp_load(state, reader, None, False, partial=True)
    return {fqn[len(prefix) :]: tensor for fqn, tensor in state.items()}


def _engine_entry(layout: CheckpointLayout, step: int, engine: str, metadata: CheckpointMetadata) -> dict[str, Any]:
    engines = read_verified_json(layout, step, ENGINES_FILE, metadata)
    if not isinstance(engines, dict):
        raise CheckpointError(f"{layout.url(layout.key(step, ENGINES_FILE))} does not hold an object of engines")
    if engine not in engines:
        raise CheckpointError(f"checkpoint step {step} holds no engine {engine!r}; it has {sorted(engines)}")
    return engines[engine]


def hf_tensors(checkpoints: Storage, step: int, engine: str = "actor") -> dict[str, torch.Tensor]:
    """Plain HF ``{name: tensor}`` of ``engine``: LoRA merged, tied LM head dropped (everything read
    checked against the checkpoint's recorded hashes)."""
    from areal_tasks.models.lora import LoraMerger

    layout = CheckpointLayout(checkpoints)
    entry = _engine_entry(layout, step, engine, read_metadata(layout, step))
    if entry.get("role", "actor") != "actor":
        raise CheckpointError(
            f"engine {engine!r} is a {entry.get('role')}: only causal-LM (actor) engines export to HF"
        )
    tensors = read_engine_tensors(checkpoints, step, engine)
    stream = tensors.items()
    if entry.get("lora"):
        stream = LoraMerger(entry["lora_scalings"])(tensors.items())
    tied = bool(entry.get("tied_embeddings"))
    return {name: tensor for name, tensor in stream if not (tied and name == "lm_head.weight")}


def export_hf(
    checkpoints: Storage, step: int, out_dir: str | os.PathLike[str], engine: str = "actor", *, force: bool = False
) -> Path:
    """Write checkpoint ``step``'s ``engine`` as an HF model directory at ``out_dir`` (atomically).

    ``out_dir`` must be absent or empty; ``force`` writes into a non-empty directory, replacing only
    files an earlier export wrote there and keeping every other file (a file of someone else's where
    one of ours would go still refuses). Every byte exported is checked against the checkpoint's
    recorded hashes first; damage raises :class:`~areal_tasks.errors.CheckpointIntegrityError`.
    """
    from transformers import AutoConfig

    from areal_tasks.models.hf_dir import write_hf_dir

    on_exists: OnExists = "merge_owned" if force else "refuse"
    _check_out_dir(out_dir, on_exists)
    layout = CheckpointLayout(checkpoints)
    metadata = read_metadata(layout, step)
    _engine_entry(layout, step, engine, metadata)  # a clear error for an unknown engine comes first
    sidecar = sidecar_files(metadata, engine)
    prefix = f"{HF_DIR}/{engine}/"
    if f"{prefix}config.json" not in sidecar:
        raise CheckpointError(
            f"{checkpoints.url_for(step_dir(step) + '/' + prefix)} has no config.json: "
            "this checkpoint cannot be exported"
        )
    tensors = hf_tensors(checkpoints, step, engine)
    with tempfile.TemporaryDirectory(prefix="areal-export-") as tmp:
        for rel in sidecar:
            target = Path(tmp) / rel[len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read_verified(layout, step, rel, metadata))
        config = AutoConfig.from_pretrained(tmp)
        try:
            write_hf_dir(out_dir, tensors, config, source_dir=tmp, on_exists=on_exists)
        except StorageError as exc:
            raise CheckpointError(f"cannot export to {out_dir}: {exc}{_FORCE_HINT if not force else ''}") from exc
    logger.info(
        "exported %s engine %r to %s (%d tensors)", checkpoints.url_for(step_dir(step)), engine, out_dir, len(tensors)
    )
    return Path(out_dir)


_FORCE_HINT = (
    " (choose an empty or new directory; --force writes into it, replacing only files an earlier export "
    "wrote there and keeping the others)"
)


def _check_out_dir(out_dir: str | os.PathLike[str], on_exists: OnExists) -> None:
    """Refuse an output directory the export may not write before reading the checkpoint."""
    try:
        check_target(out_dir, on_exists)
    except StorageError as exc:
        hint = _FORCE_HINT if on_exists == "refuse" and Path(out_dir).is_dir() else ""
        raise CheckpointError(f"cannot export to {out_dir}: {exc}{hint}") from exc
