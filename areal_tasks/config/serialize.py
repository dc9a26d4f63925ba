"""Resolved config out: plain dict, YAML text, a stable hash, and ``<run_dir>/config.yaml``.

The YAML written here loads back (:func:`areal_tasks.config.load_config`) to an equal config with
the same hash, so a run directory always records exactly what ran.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from areal_tasks.config.job import JobConfig
from areal_tasks.config.yaml_io import dump_yaml
from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

#: file name of the resolved config inside the run directory.
RESOLVED_FILE = "config.yaml"
#: hex characters kept from the sha256 of the resolved config.
HASH_LENGTH = 12


def config_to_dict(cfg: JobConfig) -> dict[str, Any]:
    """The config as plain data (sections as nested dicts, in field order)."""
    return dataclasses.asdict(cfg)


def dump_config_yaml(cfg: JobConfig) -> str:
    """The config as YAML that loads back to an equal config."""
    return dump_yaml(config_to_dict(cfg))


def config_hash(cfg: JobConfig) -> str:
    """A stable short sha256 of the config (key order and formatting do not matter)."""
    canonical = json.dumps(config_to_dict(cfg), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:HASH_LENGTH]


def write_resolved(cfg: JobConfig) -> Path:
    """Write the config to ``<experiment.run_dir>/config.yaml`` (atomically) and return that path.

    ``cfg`` must be resolved (``load_config`` does it): ``experiment.run_dir`` set and absolute.
    """
    run_dir = cfg.experiment.run_dir
    if run_dir is None or not os.path.isabs(run_dir):
        raise ConfigError(
            f"experiment.run_dir: must be an absolute path to write the resolved config, got {run_dir!r}; "
            "build the config with load_config(), which resolves it"
        )
    from storage.atomic import write_local_text  # storage (fsspec) loads only when a config is written

    target = Path(run_dir) / RESOLVED_FILE
    text = f"# resolved configuration written by areal-tasks; config_hash: {config_hash(cfg)}\n" + dump_config_yaml(cfg)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_file() and target.read_text(encoding="utf-8") != text:
            logger.warning("replacing %s, which holds a different configuration", target)
        write_local_text(target, text)
    except OSError as exc:
        raise ConfigError(f"experiment.run_dir: cannot write {target}: {exc.strerror or exc}") from exc
    logger.info("wrote resolved config to %s", target)
    return target
