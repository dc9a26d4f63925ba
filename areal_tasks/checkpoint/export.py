"""HF export of a DCP checkpoint: a model directory that plain ``transformers`` loads.

At save time every checkpoint gets a small HF sidecar per engine (``hf/<engine>/config.json`` and
the tokenizer files of the model it was built from: the engine's ``hf_sidecar_files()``). Export
then needs no engine and no process group: the engine's model tensors are read from the DCP data
(shards reassembled into full tensors by DCP's resharding), LoRA adapters are merged into the base
weights (``W0 + s * B @ A``, the same code the engine's own HF save uses), a tied LM head is
dropped, and the directory is written atomically with the engine's HF writer
(:func:`areal_tasks.models.hf_dir.write_hf_dir`, the one writer of HF directories; the sidecar uses
its config clean-up and tokenizer file list) -- so the export equals ``engine.save(path, "hf")``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.checkpoint.layout import ENGINES_FILE, HF_DIR, step_dir
from areal_tasks.checkpoint.state import ENGINES_KEY
from areal_tasks.errors import CheckpointError

if TYPE_CHECKING:
    import torch

    from storage import Storage

logger = logging.getLogger(__name__)


def read_engine_tensors(checkpoints: Storage, step: int, engine: str) -> dict[str, torch.Tensor]:
    """The full model tensors of ``engine`` in checkpoint ``step`` (state-dict names), in one process."""
    import torch

    from areal_tasks.checkpoint.dcp_index import dtype_of
    from areal_tasks.checkpoint.dcp_io import StorageDCPReader, dcp_load, read_index

    directory = step_dir(step)
    index = read_index(checkpoints, directory)
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
    dcp_load(state, StorageDCPReader(checkpoints, directory), None, False, partial=True)
    return {fqn[len(prefix) :]: tensor for fqn, tensor in state.items()}


def _engine_entry(checkpoints: Storage, step: int, engine: str) -> dict[str, Any]:
    engines = json.loads(checkpoints.read_text(f"{step_dir(step)}/{ENGINES_FILE}"))
    if engine not in engines:
        raise CheckpointError(f"checkpoint step {step} holds no engine {engine!r}; it has {sorted(engines)}")
    return engines[engine]


def hf_tensors(checkpoints: Storage, step: int, engine: str = "actor") -> dict[str, torch.Tensor]:
    """Plain HF ``{name: tensor}`` of ``engine``: LoRA merged, tied LM head dropped."""
    from areal_tasks.models.lora import LoraMerger

    entry = _engine_entry(checkpoints, step, engine)
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


def export_hf(checkpoints: Storage, step: int, out_dir: str | os.PathLike[str], engine: str = "actor") -> Path:
    """Write checkpoint ``step``'s ``engine`` as an HF model directory at ``out_dir`` (atomically)."""
    from transformers import AutoConfig

    from areal_tasks.models.hf_dir import write_hf_dir

    _engine_entry(checkpoints, step, engine)  # a clear error for an unknown engine comes first
    sidecar_key = f"{step_dir(step)}/{HF_DIR}/{engine}"
    sidecar = checkpoints.walk_files(sidecar_key) if checkpoints.exists(sidecar_key) else {}
    if "config.json" not in sidecar:
        raise CheckpointError(
            f"{checkpoints.url_for(sidecar_key)} has no config.json: this checkpoint cannot be exported"
        )
    tensors = hf_tensors(checkpoints, step, engine)
    with tempfile.TemporaryDirectory(prefix="areal-export-") as tmp:
        for name in sidecar:
            target = Path(tmp) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(checkpoints.read_bytes(f"{sidecar_key}/{name}"))
        config = AutoConfig.from_pretrained(tmp)
        write_hf_dir(out_dir, tensors, config, source_dir=tmp)
    logger.info(
        "exported %s engine %r to %s (%d tensors)", checkpoints.url_for(step_dir(step)), engine, out_dir, len(tensors)
    )
    return Path(out_dir)
