"""Resolved config out: plain dict, YAML text, a stable hash, and ``<run_dir>/config.yaml``.

Everything here is for people and files, so secrets are redacted by default
(:func:`storage.redact.redact_value`: values under secret names such as ``storage.options.secret``,
URL passwords and signatures become ``***``); ``show_secrets=True`` is for the few callers that
need the real values (``areal config show --show-secrets``, :mod:`areal_tasks.config.secrets`).

The YAML written here loads back (:func:`areal_tasks.config.load_config`) to an equal config with
the same hash, so a run directory always records exactly what ran; a config with secrets loads back
equal when its secrets come through ``$AREAL_CONFIG_SECRETS`` (:func:`dump_for_workers` writes the
file and returns that variable for the processes that read it).

The hash is over the redacted tree. It is written next to the redacted YAML (the file's header,
MLflow's ``areal.config_hash`` tag, checkpoint metadata), so anyone can recompute it from what was
recorded; a hash over the secrets would let whoever holds the rest of the config test guesses of a
weak password offline against the published value; and rotating a credential does not change what
ran, so it should not change the hash.
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


def config_to_dict(cfg: JobConfig, *, show_secrets: bool = False) -> dict[str, Any]:
    """The config as plain data (sections as nested dicts, in field order), secrets redacted
    unless ``show_secrets``."""
    tree = dataclasses.asdict(cfg)
    if show_secrets:
        return tree
    from storage.redact import redact_value  # storage loads only when a config is written or shown

    return redact_value(tree)


def dump_config_yaml(cfg: JobConfig, *, show_secrets: bool = False) -> str:
    """The config as YAML that loads back to an equal config (secrets redacted unless ``show_secrets``)."""
    return dump_yaml(config_to_dict(cfg, show_secrets=show_secrets))


def config_hash(cfg: JobConfig) -> str:
    """A stable short sha256 of the redacted config (key order and formatting do not matter; see
    the module docstring for why secrets are left out)."""
    canonical = json.dumps(config_to_dict(cfg), sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:HASH_LENGTH]


def dump_for_workers(cfg: JobConfig, path: str | os.PathLike[str]) -> dict[str, str]:
    """Write ``cfg`` (redacted) to ``path`` for worker processes to load; return the environment
    they need besides (``$AREAL_CONFIG_SECRETS`` with the secrets, or ``{}``)."""
    from areal_tasks.config.secrets import secrets_env

    Path(path).write_text(dump_config_yaml(cfg), encoding="utf-8")
    return secrets_env(cfg)


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
