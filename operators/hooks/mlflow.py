"""MLflow hook: pipeline runs, metrics, checkpoint pointer models and the model registry.

Where the tracking server is, first match wins:

1. ``tracking_uri`` given to the hook (e.g. a DAG Param);
2. the Airflow connection ``areal_mlflow`` (conn type ``generic``): its host when it holds a URI
   (``http://mlflow:5000``, ``sqlite:////runs/mlflow.db``), else ``<schema or http>://host:port``;
3. the environment variable ``MLFLOW_TRACKING_URI``.

The registry is the same store (``registry_uri = tracking_uri``).

A password in the URI (``https://user:PASS@mlflow``) is registered with Airflow's secrets masker and
never shown: messages use :attr:`MlflowHook.shown_uri` (:func:`storage.redact.redact_url`) and the
DAGs pass that redacted form between tasks. A hook given a redacted URI (``***`` in it) resolves
the real one from the connection or the environment, as if given none, and checks that it is the
same URI (``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` keep credentials out of the URI
altogether).

Checkpoints are multi-GB, so they never go to MLflow: :meth:`MlflowHook.log_checkpoint_model` makes
an MLflow 3 *logged model* whose only artifact is ``pointer.json`` (the checkpoint URL and the eval
metrics), with the URL also as a param and a tag. :meth:`MlflowHook.register` registers such a model
under a name, always with the alias ``candidate``, and moves ``champion`` to it only when it beats
the current champion on the gate metric (a strict improvement; the metric values are kept on each
version as ``areal.metric.<name>`` tags, so the comparison needs no run lookup).

mlflow is imported inside the methods only.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from operators.exceptions import ArealAirflowError

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion

__all__ = ["CANDIDATE_ALIAS", "CHAMPION_ALIAS", "MlflowHook"]

CANDIDATE_ALIAS = "candidate"
CHAMPION_ALIAS = "champion"
#: ``model_type`` of the logged models that point at a checkpoint.
POINTER_MODEL_TYPE = "checkpoint-pointer"
POINTER_FILE = "pointer.json"
CHECKPOINT_TAG = "areal.checkpoint_url"
MODEL_URI_TAG = "areal.model_uri"
#: version tag holding the local HF directory the checkpoint was exported to for evaluation.
MODEL_DIR_TAG = "areal.model_dir"
GATE_TAG = "areal.gate_metric"
METRIC_TAG_PREFIX = "areal.metric."
TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"


class MlflowHook(BaseHook):
    """One MLflow tracking server and registry (see the module docstring for how it is found)."""

    conn_name_attr = "conn_id"
    default_conn_name = "areal_mlflow"
    conn_type = "generic"
    hook_name = "AReaL MLflow"

    def __init__(self, tracking_uri: str | None = None, conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        from storage.redact import REDACTED

        self.conn_id = conn_id
        self._tracking_uri = tracking_uri or None
        #: a redacted URI given by a caller: the resolved one must show as this.
        self._redacted_uri: str | None = None
        if self._tracking_uri is not None and REDACTED in self._tracking_uri:
            self._redacted_uri, self._tracking_uri = self._tracking_uri, None
        self._client: MlflowClient | None = None

    # ------------------------------------------------------------------ connection

    @property
    def tracking_uri(self) -> str:
        """The resolved tracking URI (ArealAirflowError when none is configured anywhere)."""
        if self._tracking_uri is None:
            from airflow.sdk.log import mask_secret

            from storage.redact import hidden_parts, redact_url

            uri = self._resolve_uri()
            if self._redacted_uri is not None and redact_url(uri) != self._redacted_uri:
                raise ArealAirflowError(
                    f"the MLflow tracking URI {self._redacted_uri} was handed over redacted, and the one configured "
                    f"here (connection {self.conn_id!r} or ${TRACKING_URI_ENV}) is another ({redact_url(uri)}); "
                    "configure the same URI for every task, or keep credentials out of it with "
                    "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD"
                )
            for part in hidden_parts(uri):
                mask_secret(part)
            self._tracking_uri = uri
        return self._tracking_uri

    @property
    def shown_uri(self) -> str:
        """The tracking URI as messages show it (password and signatures masked)."""
        from storage.redact import redact_url

        return redact_url(self.tracking_uri)

    def _resolve_uri(self) -> str:
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            conn = None
        if conn is not None and conn.host:
            host = conn.host.strip()
            if "://" in host:
                return host
            return f"{conn.schema or 'http'}://{host}" + (f":{conn.port}" if conn.port else "")
        env = os.environ.get(TRACKING_URI_ENV)
        if env:
            return env
        raise ArealAirflowError(
            f"no MLflow tracking URI: pass tracking_uri (e.g. the DAG Param mlflow_tracking_uri), define the "
            f"Airflow connection {self.conn_id!r} (conn type generic, host = the URI) or set ${TRACKING_URI_ENV}"
        )

    def get_conn(self) -> MlflowClient:
        """The :class:`mlflow.MlflowClient` of the tracking URI (tracking and registry)."""
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        return self._client

    # ------------------------------------------------------------------ runs

    def start_run(
        self,
        experiment: str,
        run_name: str | None = None,
        tags: Mapping[str, str] | None = None,
        *,
        artifact_location: str | None = None,
    ) -> str:
        """Create a run in ``experiment`` (created when missing, with ``artifact_location``: by default,
        for a ``sqlite:///`` store, a folder beside the database); its id."""
        from mlflow.exceptions import MlflowException

        from areal_tasks.config.mlflow_paths import local_artifact_location

        artifact_location = artifact_location or local_artifact_location(self.tracking_uri)
        client = self.get_conn()
        try:
            found = client.get_experiment_by_name(experiment)
            if found is None:
                try:
                    experiment_id = client.create_experiment(experiment, artifact_location=artifact_location)
                except MlflowException as exc:
                    if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                        raise
                    experiment_id = client.get_experiment_by_name(experiment).experiment_id  # made concurrently
            elif found.lifecycle_stage == "deleted":
                raise ArealAirflowError(
                    f"MLflow experiment {experiment!r} at {self.shown_uri} is deleted; "
                    "restore it or choose another experiment name"
                )
            else:
                experiment_id = found.experiment_id
            run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
        except MlflowException as exc:
            raise ArealAirflowError(
                f"cannot start an MLflow run in {experiment!r} at {self.shown_uri}: {_shown(exc)}"
            ) from exc
        self.log.info("MLflow run %s started in experiment %s (%s)", run.info.run_id, experiment, experiment_id)
        return run.info.run_id

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Mark ``run_id`` FINISHED (or FAILED / KILLED)."""
        self._call(f"end run {run_id}", lambda c: c.set_terminated(run_id, status=status))

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: int = 0, *, model_id: str | None = None
    ) -> None:
        """Log the numeric ``metrics`` at ``step`` (non-numeric values are skipped); ``model_id`` links them."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step, model_id=model_id) for k, v in _numeric(metrics).items()]
        if batch:
            self._call(f"log {len(batch)} metrics to run {run_id}", lambda c: c.log_batch(run_id, metrics=batch))

    def log_artifacts(self, run_id: str, paths: Sequence[str | os.PathLike[str]], artifact_path: str) -> str:
        """Upload the local files ``paths`` under ``artifact_path`` of ``run_id``; returns that folder's
        artifact URI (e.g. ``file:///.../mlartifacts/<run>/artifacts/report``). A retry overwrites."""
        for path in paths:
            self._call(
                f"log the artifact {path} to run {run_id}",
                lambda c, path=path: c.log_artifact(run_id, str(path), artifact_path),
            )
        root = self._call(f"read run {run_id}", lambda c: c.get_run(run_id)).info.artifact_uri
        uri = f"{root.rstrip('/')}/{artifact_path.strip('/')}"
        self.log.info("MLflow run %s: %d artifact(s) in %s", run_id, len(paths), uri)
        return uri

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Log ``params``; keys the run already has are skipped (params are write-once; a retry re-logs)."""
        from mlflow.entities import Param

        existing = self._call(f"read run {run_id}", lambda c: c.get_run(run_id)).data.params
        fresh = []
        for key, value in params.items():
            text = str(value)
            if key in existing:
                if existing[key] != text:
                    self.log.warning(
                        "MLflow param %s is already %r on run %s; keeping it (not %r)", key, existing[key], run_id, text
                    )
                continue
            fresh.append(Param(key, text))
        for start in range(0, len(fresh), 100):
            chunk = fresh[start : start + 100]
            self._call(f"log params to run {run_id}", lambda c, chunk=chunk: c.log_batch(run_id, params=chunk))

    # ------------------------------------------------------------------ checkpoint pointer models

    def log_checkpoint_model(
        self,
        run_id: str,
        checkpoint_url: str,
        metrics: Mapping[str, float] | None = None,
        *,
        name: str | None = None,
        step: int | None = None,
    ) -> str:
        """A logged model of ``run_id`` pointing at ``checkpoint_url`` (no weights); returns ``models:/<id>``.

        ``metrics`` are logged to the run linked to the model; ``name`` defaults to the checkpoint's
        last path component (``step_40``), ``step`` to the number in it. A READY pointer model of the
        same run and URL (from an earlier try of the task) is reused: only the metrics are logged again.
        """
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus

        leaf = checkpoint_url.rstrip("/").rsplit("/", 1)[-1]
        name = name or leaf
        if step is None:
            digits = leaf.rsplit("_", 1)[-1]
            step = int(digits) if digits.isdigit() else 0
        metrics = _numeric(metrics or {})
        client = self.get_conn()
        run = self._call(f"read run {run_id}", lambda c: c.get_run(run_id))
        earlier = self._call(
            "search logged models",
            lambda c: c.search_logged_models(
                experiment_ids=[run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
            ),
        )
        for found in earlier:
            if found.tags.get(CHECKPOINT_TAG) == checkpoint_url and found.status == LoggedModelStatus.READY:
                self.log.info("reusing the logged model %s that already points at %s", found.model_id, checkpoint_url)
                self.log_metrics(run_id, metrics, step, model_id=found.model_id)
                return f"models:/{found.model_id}"
        model = self._call(
            f"create the logged model {name}",
            lambda c: c.create_logged_model(
                run.info.experiment_id,
                name=name,
                source_run_id=run_id,
                model_type=POINTER_MODEL_TYPE,
                tags={CHECKPOINT_TAG: checkpoint_url, "areal.weights": "external"},
                params={"checkpoint_url": checkpoint_url, "step": str(step)},
            ),
        )
        model_id = model.model_id
        try:
            with tempfile.TemporaryDirectory(prefix="areal-pointer-") as tmp:
                pointer = {"checkpoint_url": checkpoint_url, "step": step, "source_run_id": run_id, "metrics": metrics}
                (Path(tmp) / POINTER_FILE).write_text(json.dumps(pointer, indent=2), encoding="utf-8")
                client.log_model_artifacts(model_id, tmp)
            self.log_metrics(run_id, metrics, step, model_id=model_id)
            client.log_outputs(run_id, [LoggedModelOutput(model_id, step)])
            client.finalize_logged_model(model_id, "READY")
        except BaseException as exc:
            try:
                client.finalize_logged_model(model_id, "FAILED")
            except Exception as inner:  # noqa: BLE001 - the original failure is what matters; say this one too
                self.log.warning("could not mark logged model %s FAILED: %s", model_id, inner)
            if isinstance(exc, Exception) and not isinstance(exc, ArealAirflowError):
                raise ArealAirflowError(
                    f"cannot log the checkpoint model {name} to run {run_id}: {_shown(exc)}"
                ) from exc
            raise
        self.log.info("MLflow logged model %s (%s) points at %s", name, model_id, checkpoint_url)
        return f"models:/{model_id}"

    # ------------------------------------------------------------------ registry

    def register(
        self,
        model_uri: str,
        name: str,
        metrics: Mapping[str, float],
        gate_metric: str,
        higher_is_better: bool = True,
        *,
        tags: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Register ``model_uri`` (``models:/<model id>``) as a version of ``name``.

        The version gets the alias ``candidate``; ``champion`` moves to it only when there is no
        champion, the champion has no value for ``gate_metric``, or its value is strictly beaten.
        ``tags`` go on a new version (e.g. ``areal.model_dir``: the exported HF directory).
        Registering the same ``model_uri`` again (a task retry) reuses its version. Returns
        ``{"name", "version", "aliases", "champion_changed", "previous_champion", "gate_metric",
        "gate_value", "champion_value"}``.
        """
        from mlflow.exceptions import MlflowException

        metrics = _numeric(metrics)
        if gate_metric not in metrics:
            raise ArealAirflowError(
                f"gate metric {gate_metric!r} is not among the evaluation metrics {sorted(metrics)}; "
                "set gate_metric to one of them"
            )
        model_id = _model_id(model_uri)
        client = self.get_conn()
        logged = self._call(f"read logged model {model_id}", lambda c: c.get_logged_model(model_id))
        try:
            client.get_registered_model(name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise ArealAirflowError(
                    f"cannot read registered model {name!r} at {self.shown_uri}: {_shown(exc)}"
                ) from exc
            try:
                client.create_registered_model(name, tags={"areal.gate_metric": gate_metric})
            except MlflowException as exc2:
                if exc2.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise ArealAirflowError(f"cannot create registered model {name!r}: {_shown(exc2)}") from exc2
        version = self._existing_version(name, model_uri)
        if version is None:
            tags = {
                MODEL_URI_TAG: model_uri,
                GATE_TAG: gate_metric,
                CHECKPOINT_TAG: logged.tags.get(CHECKPOINT_TAG, ""),
                **{f"{METRIC_TAG_PREFIX}{k}": repr(v) for k, v in metrics.items()},
                **{k: str(v) for k, v in (tags or {}).items()},
            }
            # source = the logged model's artifact location: a ``models:/`` source makes some stores
            # resolve the model through the process-wide tracking URI instead of this client's.
            version = self._call(
                f"create a version of {name!r}",
                lambda c: c.create_model_version(
                    name, source=logged.artifact_location, run_id=logged.source_run_id, tags=tags, model_id=model_id
                ),
            )
        else:
            self.log.info("%s is already version %s of %s: reusing it", model_uri, version.version, name)
        new = str(version.version)
        self._call(f"set alias {CANDIDATE_ALIAS}", lambda c: c.set_registered_model_alias(name, CANDIDATE_ALIAS, new))
        champion = self.get_champion(name)
        gate_value = metrics[gate_metric]
        champion_value = None if champion is None else champion["metrics"].get(gate_metric)
        if champion is not None and champion["version"] == new:
            promote = False
        elif champion is None or champion_value is None:
            promote = True
            if champion is not None:
                self.log.warning(
                    "champion v%s of %s has no %s: promoting v%s", champion["version"], name, gate_metric, new
                )
        else:
            promote = gate_value > champion_value if higher_is_better else gate_value < champion_value
        if promote:
            self._call(f"set alias {CHAMPION_ALIAS}", lambda c: c.set_registered_model_alias(name, CHAMPION_ALIAS, new))
        self.log.info(
            "%s v%s: %s=%s vs champion %s (%s): %s",
            name,
            new,
            gate_metric,
            gate_value,
            None if champion is None else f"v{champion['version']}",
            champion_value,
            "new champion" if promote else "champion kept",
        )
        aliases = sorted(self._call("read the version", lambda c: c.get_model_version(name, new)).aliases)
        return {
            "name": name,
            "version": new,
            "aliases": aliases,
            "champion_changed": promote,
            "previous_champion": None if champion is None else champion["version"],
            "gate_metric": gate_metric,
            "gate_value": gate_value,
            "champion_value": champion_value,
        }

    def get_champion(self, name: str) -> dict[str, Any] | None:
        """The version of ``name`` holding the ``champion`` alias, or None (also when ``name`` is unregistered).

        Returns ``{"version", "source", "run_id", "model_uri", "checkpoint_url", "model_dir", "metrics",
        "tags"}`` (``model_dir``: the ``areal.model_dir`` tag, the HF export evaluated, or None).
        """
        from mlflow.exceptions import MlflowException

        client = self.get_conn()
        try:
            client.get_registered_model(name)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise ArealAirflowError(
                f"cannot read registered model {name!r} at {self.shown_uri}: {_shown(exc)}"
            ) from exc
        try:
            version = client.get_model_version_by_alias(name, CHAMPION_ALIAS)
        except MlflowException as exc:
            if exc.error_code in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"):
                return None  # the alias is not set
            raise ArealAirflowError(f"cannot read the champion of {name!r}: {_shown(exc)}") from exc
        return _describe_version(version)

    # ------------------------------------------------------------------ internals

    def _existing_version(self, name: str, model_uri: str) -> ModelVersion | None:
        versions = self._call(f"list versions of {name!r}", lambda c: c.search_model_versions(f"name='{name}'"))
        for version in versions:
            if version.tags.get(MODEL_URI_TAG) == model_uri:
                return version
        return None

    def _call(self, what: str, fn: Any) -> Any:
        """``fn(client)``, with an MLflow failure turned into ArealAirflowError naming ``what``."""
        from mlflow.exceptions import MlflowException

        try:
            return fn(self.get_conn())
        except MlflowException as exc:
            raise ArealAirflowError(f"MLflow at {self.shown_uri}: cannot {what}: {_shown(exc)}") from exc


def _shown(exc: BaseException) -> str:
    """An MLflow client error as a message may quote it (client errors quote the URL they called)."""
    from storage.redact import redact_text

    return redact_text(str(exc))


def _describe_version(version: ModelVersion) -> dict[str, Any]:
    tags = dict(version.tags)
    metrics = {}
    for key, value in tags.items():
        if key.startswith(METRIC_TAG_PREFIX):
            try:
                metrics[key[len(METRIC_TAG_PREFIX) :]] = float(value)
            except ValueError:
                continue  # a hand-edited tag that is not a number: not a metric
    return {
        "version": str(version.version),
        "source": version.source,
        "run_id": version.run_id,
        "model_uri": tags.get(MODEL_URI_TAG),
        "checkpoint_url": tags.get(CHECKPOINT_TAG),
        "model_dir": tags.get(MODEL_DIR_TAG),
        "metrics": metrics,
        "tags": tags,
    }


def _model_id(model_uri: str) -> str:
    prefix = "models:/"
    rest = model_uri[len(prefix) :] if model_uri.startswith(prefix) else ""
    if not rest or "/" in rest.strip("/"):
        raise ArealAirflowError(
            f"model_uri {model_uri!r} is not a logged model URI; expected models:/<model id> "
            "(what log_checkpoint_model returns)"
        )
    return rest.strip("/")


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric entries of ``metrics`` as floats (bools and text are dropped)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        number = float(value)
        if number == number and number not in (float("inf"), float("-inf")):
            out[key] = number
    return out
