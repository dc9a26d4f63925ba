"""Ways to damage a saved checkpoint on a local disk, for the integrity and export tests: flipped
bytes inside one tensor item, an edited ``engines.json`` or ``metadata.json``, a truncated data file,
and an index rewritten together with the hashes that record it (a writer bug, not storage damage)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from areal_tasks.checkpoint.layout import COMPLETE_MARKER


def _record(folder: Path, step: int, fqn: str) -> dict:
    index = json.loads((folder / f"step_{step}/dcp/index.json").read_text())
    return next(item for item in index["items"] if item["fqn"] == fqn)


def flip_item(folder: Path, fqn: str, step: int = 2) -> Path:
    """XOR 64 bytes at the start of item ``fqn`` (as the index of ``step`` records it)."""
    record = _record(folder, step, fqn)
    path = folder / record["dir"] / record["file"]
    data = bytearray(path.read_bytes())
    for offset in range(64):
        data[record["pos"] + offset] ^= 0x5A
    path.write_bytes(bytes(data))
    return path


def edit_engines(folder: Path) -> Path:
    path = folder / "step_2/engines.json"
    engines = json.loads(path.read_text())
    engines["actor"]["version"] = 7
    path.write_text(json.dumps(engines, indent=1, sort_keys=True))
    return path


def truncate_data(folder: Path) -> Path:
    path = folder / "step_2/dcp/rank-00000.distcp"
    path.write_bytes(path.read_bytes()[:-100])
    return path


def edit_metadata(folder: Path) -> Path:
    path = folder / "step_2/metadata.json"
    path.write_text(path.read_text().replace('"loss": 0.5', '"loss": 0.25'))
    return path


def rewrite_index_consistently(folder: Path, step: int, index: dict) -> None:
    """Replace the index and update the hashes that record it (a writer bug, not storage damage)."""
    data = json.dumps(index, sort_keys=True).encode()
    (folder / f"step_{step}/dcp/index.json").write_bytes(data)
    meta_path = folder / f"step_{step}/metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["files"]["dcp/index.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    meta_bytes = json.dumps(meta, indent=1, sort_keys=True).encode()
    meta_path.write_bytes(meta_bytes)
    marker_path = folder / f"step_{step}/{COMPLETE_MARKER}"
    marker = json.loads(marker_path.read_text())
    marker["metadata_sha256"] = hashlib.sha256(meta_bytes).hexdigest()
    marker_path.write_text(json.dumps(marker))
