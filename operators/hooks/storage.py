"""Storage hook: pre-flight checks of a storage URL and the checkpoints stored under it.

:meth:`StorageHook.validate` runs :func:`storage.validate.validate_storage` (path or bucket usable,
filesystem, free space, a write/read round trip) and fails with every failed check's message and
fix, so a misconfigured location stops a pipeline in seconds rather than hours into training.
:meth:`StorageHook.list_checkpoints` lists the complete checkpoints of a run
(``<url>/<experiment>/<trial>/checkpoints/step_<N>``, see :mod:`areal_tasks.checkpoint.layout`).

S3 credentials come from ``options`` or the environment (``AWS_ACCESS_KEY_ID``...), never logs.
Options that arrive redacted (``***``, as the DAGs pass ``storage.options`` between tasks) are
filled back from ``$AREAL_CONFIG_SECRETS`` (:func:`areal_tasks.config.secrets.restore_redacted`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook

from operators.exceptions import ArealAirflowError, ArealConfigError

__all__ = ["StorageHook"]


class StorageHook(BaseHook):
    """One storage location: ``url`` (path, ``file://``, ``s3://``) plus fsspec ``options``."""

    hook_name = "AReaL storage"

    def __init__(self, url: str, options: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not url:
            raise ArealAirflowError("StorageHook needs a storage URL (a path, file://... or s3://bucket/prefix)")
        from areal_tasks.config.secrets import restore_redacted
        from storage.redact import redact_url

        self.url = str(url)
        #: the URL as messages show it (a password or signature masked).
        self.shown_url = redact_url(self.url)
        self.options = restore_redacted(options or {}, "storage.options")

    def get_conn(self) -> Any:
        """The :class:`storage.Storage` of the URL (ArealAirflowError for a bad URL or option)."""
        from storage import Storage, StorageError

        try:
            return Storage.from_url(self.url, self.options)
        except StorageError as exc:
            raise ArealConfigError(f"storage {self.shown_url!r} is misconfigured: {exc}") from exc

    def validate(self, *, min_free_gb: float | None = 1.0, nodes: int = 1) -> dict[str, Any]:
        """Run the pre-flight checks; return the report as a dict, or raise with every failure and its fix.

        Failures raise :class:`ArealConfigError` (no Airflow retries: a wrong path, bucket or
        credential does not fix itself; rerun the task once it is fixed).
        """
        from storage import StorageError
        from storage.validate import Thresholds, validate_storage

        try:
            report = validate_storage(
                self.url, self.options, thresholds=Thresholds(min_free_gb=min_free_gb), nodes=nodes
            )
        except (StorageError, ValueError) as exc:
            raise ArealConfigError(f"storage {self.shown_url!r} is misconfigured: {exc}") from exc
        for result in report.warnings():
            self.log.warning("storage check %s: %s (%s)", result.check, result.message, result.fix)
        if not report.ok:
            lines = [
                f"- {r.check} at {r.path}: {r.message}; fix: {r.fix or 'see the message'}" for r in report.failures()
            ]
            raise ArealConfigError(f"storage {self.shown_url!r} failed its pre-flight checks:\n" + "\n".join(lines))
        self.log.info("storage %s passed %d check(s)", report.url, len(report.results))
        return report.to_dict()

    def list_checkpoints(self, experiment: str | None = None, trial: str | None = None) -> list[str]:
        """URLs of the complete checkpoints (``.../checkpoints/step_<N>``), oldest first.

        With ``experiment`` and ``trial`` the URL is a storage root holding runs; without them it is
        a checkpoints folder itself.
        """
        from areal_tasks.checkpoint.layout import CheckpointLayout, step_dir
        from areal_tasks.errors import CheckpointError
        from storage import StorageError

        if (experiment is None) != (trial is None):
            raise ArealAirflowError("list_checkpoints: give both experiment and trial, or neither")
        try:
            root = self.get_conn()
            layout = CheckpointLayout.for_run(root, experiment, trial) if experiment else CheckpointLayout(root)
            return [layout.url(step_dir(step)) for step in layout.complete_steps()]
        except (StorageError, CheckpointError) as exc:
            raise ArealAirflowError(f"cannot list the checkpoints under {self.shown_url!r}: {exc}") from exc
