"""``detect_model``: find a model's ``config.json`` and describe it as a :class:`ModelInfo`.

Accepted references, in order: ``tiny:<family>`` (the tiny-model kit builds or reuses the model),
a local Hugging Face model directory (or a path to its ``config.json``), then a hub id such as
``Qwen/Qwen2-0.5B``, whose ``config.json`` alone is fetched with ``huggingface_hub`` (honouring
``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and the local hub cache). No weights are read, so detection of
a 70B model takes milliseconds; torch is not imported unless a tiny model must be built.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.info import ModelInfo, model_info_from_config
from areal_tasks.models.tiny.spec import TINY_PREFIX

logger = logging.getLogger(__name__)

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def _read_config(path: Path, source: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ModelError(f"{source}: cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ModelError(f"{source}: {path} is not valid JSON ({exc}); re-save the model with save_pretrained") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{source}: {path} must hold a JSON object, got {type(data).__name__}")
    return data


def _download_config(repo_id: str) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo_id, "config.json"))
    except (OSError, ValueError) as exc:  # hub HTTP/offline/not-found errors are OSErrors; bad ids ValueErrors
        raise ModelError(
            f"{repo_id!r} is not a local directory and its config.json could not be reached on the Hugging Face "
            f"hub ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}). Pass a local "
            "model directory, or set HF_ENDPOINT to a reachable mirror, or pre-fill the hub cache and set "
            "HF_HUB_OFFLINE=1."
        ) from exc


def resolve_config_path(path_or_id: str) -> Path:
    """The ``config.json`` that ``path_or_id`` refers to (building a tiny model or fetching from the hub)."""
    if path_or_id.startswith(TINY_PREFIX):
        from areal_tasks.models.tiny.kit import build_tiny_model
        from areal_tasks.models.tiny.spec import parse_tiny_spec

        family, overrides = parse_tiny_spec(path_or_id)
        return build_tiny_model(family, **overrides) / "config.json"
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelError(
                f"{path_or_id}: directory has no config.json; pass a Hugging Face model directory "
                "(written by save_pretrained) or a hub id"
            )
        return config
    if path.is_file():
        if path.suffix != ".json":
            raise ModelError(f"{path_or_id}: expected a model directory or its config.json, got a file")
        return path
    if _REPO_ID.match(path_or_id):
        return _download_config(path_or_id)
    raise ModelError(
        f"{path_or_id}: no such model directory (and not a hub id of the form org/name); "
        "pass an existing local directory with config.json, a hub id, or tiny:<family>"
    )


def detect_model(path_or_id: str) -> ModelInfo:
    """Describe the model at a local directory, a hub id or ``tiny:<family>``.

    Raises :class:`ModelError` when the reference cannot be resolved or its config is unusable.
    """
    reference = str(path_or_id)
    config_path = resolve_config_path(reference)
    is_local = reference.startswith(TINY_PREFIX) or Path(reference).expanduser().exists()
    source = str(config_path.parent) if is_local else reference
    info = model_info_from_config(_read_config(config_path, reference), source=source)
    logger.debug("detected %s (%s, %d parameters) at %s", info.family, info.architecture, info.num_parameters, source)
    return info
