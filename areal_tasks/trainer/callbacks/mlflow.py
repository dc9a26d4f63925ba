"""The MLflow tracking callback: one RL job's config, metrics, checkpoints and eval models in an MLflow run.

:class:`MLflowCallback` is a trainer callback (:mod:`areal_tasks.trainer.callbacks.base`):
``on_start``, ``on_step``, ``on_checkpoint``, ``on_eval``, ``on_end`` and ``fail``. It talks to MLflow
through its own :class:`mlflow.MlflowClient`, never the fluent API, so it sets no process-wide
tracking URI or active run and two callbacks in one process do not interfere.

What goes where (see ``docs/tracking.md``):

* ``on_start``: the experiment is fetched or created; the run is either the one named by
  ``run_id`` / ``$AREAL_MLFLOW_RUN_ID`` (created upstream, e.g. by an Airflow task, so one run holds
  the whole pipeline) or a new one. The resolved config goes in as params with dotted keys
  (``actor.optimizer.lr``) and as the artifact ``config/resolved.yaml``;
* ``on_step``: the step's metrics every ``log_every`` steps (and always on a step carrying
  ``eval/`` metrics), non-finite values skipped, eval metrics ``on_eval`` already logged at that
  step not repeated;
* ``on_checkpoint``: ``checkpoints/step_<N>.json`` (URL + metadata, never weights) and the tag
  ``areal.latest_checkpoint``;
* ``on_eval``: the eval metrics at that step and, given a model directory, an MLflow logged model
  ``step_<N>`` holding that directory's files;
* ``on_end``: ``summary/...`` metrics, ``summary/rl_summary.json``, and the run FINISHED when this
  callback created it (an attached run stays open for the pipeline's next tasks).

Only ``on_start`` raises (:class:`~areal_tasks.errors.ConfigError` for a bad URI, an unreachable
server, a deleted experiment or an unknown run id). After that, tracking never stops training: an
MLflow failure is logged as a warning and counted in :attr:`MLflowCallback.errors`.

The config reaches MLflow redacted (:func:`~areal_tasks.config.serialize.config_to_dict`), and
every message and log line shows the tracking URI through :func:`storage.redact.redact_url`, so a
password in the URI (``https://user:PASS@mlflow``) reaches neither MLflow nor a log.

This is the only module of the package that imports mlflow; nothing imports it at module level.
"""

from __future__ import annotations

import json
import logging
import math
import os
import posixpath
import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.api.run_dir import MLFLOW_RUN_ID_ENV
from areal_tasks.config.mlflow_paths import local_artifact_location
from areal_tasks.errors import ConfigError
from areal_tasks.trainer.callbacks.base import Callback

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

#: environment variable naming an existing MLflow run to attach to (set by the pipeline).
#: tag holding the URL of the newest checkpoint.
LATEST_CHECKPOINT_TAG = "areal.latest_checkpoint"
#: tag holding the reason given to :meth:`MLflowCallback.fail`.
FAILURE_TAG = "areal.failure_reason"
#: tag holding :func:`areal_tasks.config.serialize.config_hash` of the logged config.
CONFIG_HASH_TAG = "areal.config_hash"
#: artifact path of the resolved config YAML.
CONFIG_ARTIFACT = "config/resolved.yaml"
#: artifact directory of the checkpoint pointers.
CHECKPOINT_ARTIFACT_DIR = "checkpoints"
#: artifact path of the end-of-run summary.
SUMMARY_ARTIFACT = "summary/rl_summary.json"
#: ``model_type`` of the logged models made from eval model directories.
MODEL_TYPE = "hf-directory"

# MLflow's limits (mlflow.utils.validation); repeated so they hold without importing mlflow.
MAX_PARAM_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000

_BAD_KEY_CHARS = re.compile(r"[^/\w.\- :]")


class MLflowCallback(Callback):
    """Logs an RL job to one MLflow run (see the module docstring for what goes where).

    ``tracking_uri`` is any MLflow tracking URI (``http://host:5000``, ``sqlite:///path.db``, ...).
    ``experiment`` is the experiment name, created when missing (with ``artifact_location`` when
    given, else the server's or store's default). ``run_id`` (or ``$AREAL_MLFLOW_RUN_ID`` when it is
    None) attaches to an existing run instead of creating one named ``run_name``. ``config`` is
    logged as params and YAML. Metrics are logged every ``log_every`` steps. ``tags`` go on a
    created run (and are set on an attached one).
    """

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        *,
        run_name: str | None = None,
        run_id: str | None = None,
        config: JobConfig | None = None,
        log_every: int = 1,
        tags: Mapping[str, str] | None = None,
        artifact_location: str | None = None,
    ) -> None:
        if log_every < 1:
            raise ConfigError(f"tracking.log_every: must be at least 1, got {log_every}")
        from storage.redact import REDACTED, redact_url

        if REDACTED in tracking_uri:
            raise ConfigError(
                f"tracking.mlflow_uri: {tracking_uri!r} holds the placeholder {REDACTED!r} of a redacted config file, "
                "not the password; give the real URI through $AREAL_CONFIG_SECRETS "
                '(\'{"tracking.mlflow_uri": "..."}\') or MLflow\'s MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD'
            )
        self.tracking_uri = tracking_uri
        #: the URI as messages and logs show it (password and signatures masked).
        self.shown_uri = redact_url(tracking_uri)
        self.experiment = experiment
        self.run_name = run_name
        self.config = config
        self.log_every = log_every
        self.tags = dict(tags or {})
        self.artifact_location = artifact_location
        #: number of MLflow calls that failed after ``on_start`` (each logged as a warning).
        self.errors = 0
        self._requested_run_id = run_id
        self._run_id: str | None = None
        self._experiment_id: str | None = None
        self._created = False
        self._ended = False
        self._last_step = 0
        self._eval_logged: tuple[int, dict[str, Any]] | None = None
        self._client: MlflowClient | None = None

    # ------------------------------------------------------------------ properties

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (None before ``on_start``)."""
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The MLflow experiment id (None before ``on_start``)."""
        return self._experiment_id

    @property
    def created_run(self) -> bool:
        """Whether this callback created its run (and so terminates it) rather than attached to one."""
        return self._created

    # ------------------------------------------------------------------ callback protocol

    def on_start(self, total_steps: int) -> None:
        """Connect, get or create the experiment, attach to or create the run, log the config.

        Raises :class:`ConfigError` naming ``tracking.mlflow_uri`` when MLflow cannot be reached or
        the experiment or run cannot be used.
        """
        from mlflow import MlflowClient

        run_id = self._requested_run_id or os.environ.get(MLFLOW_RUN_ID_ENV) or None
        try:
            client = MlflowClient(tracking_uri=self.tracking_uri)
            if run_id is not None:
                self._attach(client, run_id)
            else:
                self._experiment_id = self._get_or_create_experiment(client)
                tags = {**self._default_tags(), **self.tags}
                run = client.create_run(self._experiment_id, tags=tags, run_name=self.run_name)
                self._run_id = run.info.run_id
                self._created = True
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"tracking.mlflow_uri: cannot use MLflow at {self.shown_uri!r} "
                f"(experiment {self.experiment!r}{f', run {run_id}' if run_id else ''}): {_describe(exc)}"
            ) from exc
        self._client = client
        self._ended = False
        logger.info(
            "MLflow: %s run %s in experiment %s (%s) at %s",
            "created" if self._created else "attached to",
            self._run_id,
            self.experiment,
            self._experiment_id,
            self.shown_uri,
        )
        if self.config is not None:
            self._log_config(self.config)

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log ``metrics`` at ``step`` every ``log_every`` steps (always when it holds ``eval/`` metrics)."""
        self._last_step = max(self._last_step, step)
        if self._eval_logged and self._eval_logged[0] == step:  # on_eval already logged these at this step
            metrics = {k: v for k, v in metrics.items() if self._eval_logged[1].get(k, object()) != v}
        if step % self.log_every != 0 and not any(key.startswith("eval/") for key in metrics):
            return
        self._log_metrics(step, metrics, what=f"metrics of step {step}")

    def on_checkpoint(self, step: int, url: str, metadata: Mapping[str, Any]) -> None:
        """Record a checkpoint saved at ``step`` under ``url``: a JSON pointer artifact and the latest tag."""
        client, run_id = self._live()
        if client is None:
            return
        pointer = {"step": step, "url": url, "metadata": dict(metadata)}
        with (
            self._guard(f"checkpoint pointer of step {step}"),
            tempfile.TemporaryDirectory(prefix="areal-mlflow-") as tmp,
        ):
            path = Path(tmp) / f"step_{step}.json"
            path.write_text(json.dumps(pointer, indent=2, default=str), encoding="utf-8")
            client.log_artifact(run_id, str(path), CHECKPOINT_ARTIFACT_DIR)
        with self._guard(f"tag {LATEST_CHECKPOINT_TAG}"):
            client.set_tag(run_id, LATEST_CHECKPOINT_TAG, _truncate(url, MAX_TAG_VALUE_LENGTH, LATEST_CHECKPOINT_TAG))

    def on_eval(self, step: int, metrics: Mapping[str, float], model_dir: str | None = None) -> None:
        """Log eval ``metrics`` at ``step``; with ``model_dir``, log that directory as the logged model ``step_<N>``.

        The logged model is made with ``create_logged_model`` + ``log_model_artifacts`` (no MLflow
        flavour, so no ``MLmodel`` file: load it with ``mlflow.artifacts.download_artifacts`` and
        transformers, not ``mlflow.pyfunc``); it is linked to the run as an output at ``step`` and
        the eval metrics carry its id.
        """
        client, run_id = self._live()
        if client is None:
            return
        model_id = None
        if model_dir is not None:
            model_id = self._log_model_dir(client, run_id, step, Path(model_dir))
        self._log_metrics(step, metrics, what=f"eval metrics of step {step}", model_id=model_id)
        self._eval_logged = (step, dict(metrics))

    def on_end(self, summary: Mapping[str, Any]) -> None:
        """Log ``summary/...`` metrics and the summary JSON; finish the run if this callback created it."""
        client, run_id = self._live()
        if client is None:
            return
        numeric = {f"summary/{key}": value for key, value in _numeric_leaves(summary)}
        self._log_metrics(self._last_step, numeric, what="summary metrics")
        with self._guard("summary artifact"), tempfile.TemporaryDirectory(prefix="areal-mlflow-") as tmp:
            path = Path(tmp) / posixpath.basename(SUMMARY_ARTIFACT)
            path.write_text(json.dumps(dict(summary), indent=2, default=_json_default), encoding="utf-8")
            client.log_artifact(run_id, str(path), posixpath.dirname(SUMMARY_ARTIFACT))
        self._terminate("FINISHED")

    def fail(self, reason: str) -> None:
        """Record ``reason`` (tag ``areal.failure_reason``) and end a created run as FAILED.

        An attached run gets the tag but keeps its status: the pipeline that created it decides.
        """
        client, run_id = self._live()
        if client is None:
            return
        with self._guard(f"tag {FAILURE_TAG}"):
            client.set_tag(run_id, FAILURE_TAG, _truncate(reason, MAX_TAG_VALUE_LENGTH, FAILURE_TAG))
        self._terminate("FAILED")

    # ------------------------------------------------------------------ on_start helpers

    def _attach(self, client: MlflowClient, run_id: str) -> None:
        from mlflow.entities import LifecycleStage

        try:
            run = client.get_run(run_id)
        except Exception as exc:
            raise ConfigError(
                f"tracking.mlflow_uri: run {run_id!r} (from run_id or ${MLFLOW_RUN_ID_ENV}) cannot be read at "
                f"{self.shown_uri!r}: {_describe(exc)}"
            ) from exc
        if run.info.lifecycle_stage == LifecycleStage.DELETED:
            raise ConfigError(f"tracking.mlflow_uri: run {run_id!r} (from run_id or ${MLFLOW_RUN_ID_ENV}) is deleted")
        if run.info.status != "RUNNING":
            logger.warning("MLflow run %s is %s; logging to it anyway", run_id, run.info.status)
        self._run_id = run.info.run_id
        self._experiment_id = run.info.experiment_id
        self._created = False
        experiment = client.get_experiment(self._experiment_id)
        if experiment.name != self.experiment:
            logger.warning(
                "MLflow run %s belongs to experiment %r, not %r: logging to it there",
                run_id,
                experiment.name,
                self.experiment,
            )
        tags = {**self._default_tags(), **self.tags}
        if tags:
            from mlflow.entities import RunTag

            existing = run.data.tags
            new = [RunTag(k, v) for k, v in tags.items() if existing.get(k) != v]
            for chunk in _chunks(new, MAX_PARAMS_PER_BATCH):
                client.log_batch(self._run_id, tags=chunk, synchronous=True)

    def _get_or_create_experiment(self, client: MlflowClient) -> str:
        from mlflow.entities import LifecycleStage
        from mlflow.exceptions import MlflowException

        experiment = client.get_experiment_by_name(self.experiment)
        if experiment is None:
            try:
                location = self.artifact_location or local_artifact_location(self.tracking_uri)
                return client.create_experiment(self.experiment, artifact_location=location)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
                experiment = client.get_experiment_by_name(self.experiment)  # created concurrently
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == LifecycleStage.DELETED:
            raise ConfigError(
                f"tracking.mlflow_experiment: MLflow experiment {self.experiment!r} is deleted at "
                f"{self.shown_uri!r}; restore it or choose another name"
            )
        return experiment.experiment_id

    def _default_tags(self) -> dict[str, str]:
        tags: dict[str, str] = {}
        if self.config is not None:
            from areal_tasks.config.serialize import config_hash

            tags[CONFIG_HASH_TAG] = config_hash(self.config)
            tags["areal.experiment"] = self.config.experiment.name
            tags["areal.trial"] = self.config.experiment.trial
        return tags

    def _log_config(self, cfg: JobConfig) -> None:
        from mlflow.entities import Param

        from areal_tasks.config.serialize import config_to_dict, dump_config_yaml

        client, run_id = self._live()
        if client is None:
            return
        params = flatten_params(config_to_dict(cfg))
        if not self._created:
            # Params are write-once: on an attached run (a retry, a recovered job) skip what is there.
            with self._guard("existing params of the attached run"):
                existing = client.get_run(run_id).data.params
                for key in [k for k in params if k in existing]:
                    if existing[key] != params.pop(key):
                        logger.warning(
                            "MLflow param %s is already %r on run %s; not changed", key, existing[key], run_id
                        )
        for chunk in _chunks([Param(k, v) for k, v in params.items()], MAX_PARAMS_PER_BATCH):
            with self._guard(f"{len(chunk)} config params"):
                client.log_batch(run_id, params=chunk, synchronous=True)
        with (
            self._guard(f"artifact {CONFIG_ARTIFACT}"),
            tempfile.TemporaryDirectory(prefix="areal-mlflow-") as tmp,
        ):
            path = Path(tmp) / posixpath.basename(CONFIG_ARTIFACT)
            path.write_text(dump_config_yaml(cfg), encoding="utf-8")
            client.log_artifact(run_id, str(path), posixpath.dirname(CONFIG_ARTIFACT))

    # ------------------------------------------------------------------ logging helpers

    def _log_metrics(self, step: int, metrics: Mapping[str, Any], *, what: str, model_id: str | None = None) -> None:
        from mlflow.entities import Metric

        client, run_id = self._live()
        if client is None:
            return
        timestamp = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            number = _as_float(value)
            if number is None or not math.isfinite(number):
                logger.debug("MLflow: skipping %s=%r at step %d (not a finite number)", key, value, step)
                continue
            name = metric_key(key)
            if name is None:
                logger.warning("MLflow: skipping metric %r: not a usable MLflow key", key)
                continue
            batch.append(Metric(name, number, timestamp, step, model_id=model_id))
        for chunk in _chunks(batch, MAX_METRICS_PER_BATCH):
            with self._guard(what):
                client.log_batch(run_id, metrics=chunk, synchronous=True)

    def _log_model_dir(self, client: MlflowClient, run_id: str, step: int, model_dir: Path) -> str | None:
        from mlflow.entities import LoggedModelOutput

        if not model_dir.is_dir():
            self.errors += 1
            logger.warning("MLflow: eval model directory %s of step %d does not exist; not logged", model_dir, step)
            return None
        model_id = None
        with self._guard(f"logged model step_{step}"):
            model = client.create_logged_model(
                self._experiment_id,
                name=f"step_{step}",
                source_run_id=run_id,
                model_type=MODEL_TYPE,
                tags={"areal.step": str(step), "areal.model_dir": str(model_dir)},
            )
            model_id = model.model_id
            try:
                client.log_outputs(run_id, [LoggedModelOutput(model_id, step)])
                client.log_model_artifacts(model_id, str(model_dir))
            except BaseException:
                try:
                    client.finalize_logged_model(model_id, "FAILED")
                except Exception:
                    logger.debug("could not mark logged model %s FAILED", model_id, exc_info=True)
                raise
            client.finalize_logged_model(model_id, "READY")
            logger.info("MLflow: logged %s as model step_%d (%s)", model_dir, step, model_id)
        return model_id

    def _terminate(self, status: str) -> None:
        client, run_id = self._live()
        if client is None or self._ended:
            return
        self._ended = True
        if not self._created:
            logger.info("MLflow: leaving run %s open (it was created upstream)", run_id)
            return
        with self._guard(f"ending run {run_id} as {status}"):
            client.set_terminated(run_id, status=status)

    def _live(self) -> tuple[Any, str]:
        """The client and run id, or ``(None, "")`` before a successful ``on_start``."""
        if self._client is None or self._run_id is None:
            return None, ""
        return self._client, self._run_id

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Turn an MLflow failure into a counted warning: tracking must not kill training."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - tracking must not kill training: counted and logged below
            self.errors += 1
            logger.warning(
                "MLflow: could not log %s to run %s (%d error(s) so far): %s",
                what,
                self._run_id,
                self.errors,
                _describe(exc),
            )


# ---------------------------------------------------------------------- pure helpers


def flatten_params(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config data as MLflow params: dotted keys, string values within MLflow's limits.

    Lists and empty mappings become JSON; None becomes ``null``. Keys longer than 250 characters
    or with characters MLflow refuses are skipped, values longer than 6000 characters are
    truncated, each with a warning.
    """
    out: dict[str, str] = {}
    for raw_key, value in tree.items():
        key = f"{prefix}{raw_key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, prefix=f"{key}."))
            continue
        if len(key) > MAX_PARAM_KEY_LENGTH:
            logger.warning(
                "MLflow: skipping param %s...: key longer than %d characters", key[:60], MAX_PARAM_KEY_LENGTH
            )
            continue
        if _BAD_KEY_CHARS.search(key) or posixpath.normpath(key) != key or key.startswith("/"):
            logger.warning(
                "MLflow: skipping param %r: MLflow keys allow only letters, digits, _ - . / : and space", key
            )
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[key] = _truncate(text, MAX_PARAM_VALUE_LENGTH, key)
    return out


def metric_key(key: str) -> str | None:
    """``key`` as a valid MLflow metric key (bad characters become ``_``), or None when it cannot be one."""
    name = _BAD_KEY_CHARS.sub("_", str(key))
    name = posixpath.normpath(name).lstrip("/") if name else name
    if not name or name in {".", ".."} or name.startswith("../") or len(name) > MAX_PARAM_KEY_LENGTH:
        return None
    return name


def _truncate(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    logger.warning("MLflow: truncating %s from %d to %d characters", what, len(text), limit)
    return text[:limit]


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            import numpy as np
        except ImportError:  # pragma: no cover - numpy is a base dependency
            return None
        if isinstance(value, np.generic) and not isinstance(value, np.bool_):
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
        return None
    return float(value)


def _numeric_leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """``(slash/joined/key, number)`` for every numeric leaf of a nested mapping."""
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _numeric_leaves(value, f"{prefix}{key}/")
            continue
        number = _as_float(value)
        if number is not None:
            yield f"{prefix}{key}", number


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _json_default(value: Any) -> Any:
    number = _as_float(value)
    return number if number is not None else str(value)


def _describe(exc: BaseException) -> str:
    """The exception's type and first line, redacted (client errors quote the URL they called)."""
    from storage.redact import redact_text

    text = redact_text(str(exc)).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:500]}" if first else type(exc).__name__
