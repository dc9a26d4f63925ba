"""``load_config``: YAML file(s) + dotted overrides -> a typed, resolved, validated ``JobConfig``.

Steps: read the file and its ``base:`` chain (:mod:`.inherit`), apply overrides (:mod:`.overrides`),
then the secret values of ``$AREAL_CONFIG_SECRETS`` (:mod:`.secrets`), build the dataclasses with
type checks (:mod:`.build`), resolve paths (run directory, storage URL), then validate across
sections (:mod:`.validate`). Each step reports every problem it finds at once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from areal_tasks.config.build import build_dataclass
from areal_tasks.config.inherit import load_tree
from areal_tasks.config.job import JobConfig
from areal_tasks.config.merge import Origins
from areal_tasks.config.overrides import apply_overrides
from areal_tasks.config.secrets import apply_secrets, read_secrets_env
from areal_tasks.config.serialize import config_to_dict
from areal_tasks.config.validate import validate_config

logger = logging.getLogger(__name__)


def default_run_dir(cfg: JobConfig, cwd: str | Path | None = None) -> Path:
    """``experiment.run_dir`` made absolute (relative to ``cwd``, default the current directory);
    ``runs/<experiment.name>/<experiment.trial>`` when it is unset."""
    base = Path(cwd) if cwd is not None else Path.cwd()
    raw = cfg.experiment.run_dir
    path = Path(raw).expanduser() if raw else Path("runs") / cfg.experiment.name / cfg.experiment.trial
    return Path(os.path.abspath(base / path))


def resolve_paths(cfg: JobConfig, cwd: str | Path | None = None) -> JobConfig:
    """A copy of ``cfg`` with ``experiment.run_dir`` absolute and ``storage.url`` filled in."""
    run_dir = default_run_dir(cfg, cwd)
    experiment = dataclasses.replace(cfg.experiment, run_dir=str(run_dir))
    storage = cfg.storage
    if storage.url is None:
        storage = dataclasses.replace(storage, url=f"file://{run_dir / 'storage'}")
    return dataclasses.replace(cfg, experiment=experiment, storage=storage)


def load_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), *, environ: Mapping[str, str] | None = None
) -> JobConfig:
    """The job config from ``path`` (None = all defaults) with ``overrides`` applied, then the secret
    values of ``environ["AREAL_CONFIG_SECRETS"]`` (default ``os.environ``), resolved and validated.

    Raises :class:`~areal_tasks.errors.ConfigError` naming every problem found. Every secret value
    of the result is registered with :mod:`storage.redact`, so this process's later log lines and
    error messages mask it.
    """
    from storage.redact import hidden_parts, register_secret

    tree: dict[str, Any] = {}
    origins: Origins = {}
    if path is not None:
        tree, origins = load_tree(path, JobConfig)
    apply_overrides(tree, overrides, JobConfig, origins)
    apply_secrets(tree, read_secrets_env(environ), JobConfig, origins)
    cfg = resolve_paths(build_dataclass(JobConfig, tree, origins))
    register_secret(hidden_parts(config_to_dict(cfg, show_secrets=True)))
    validate_config(cfg)
    logger.debug("loaded configuration from %s with %d override(s)", path or "defaults", len(overrides))
    return cfg
