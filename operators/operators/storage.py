"""``ValidateStorageOperator``: the storage pre-flight checks, first in the pipeline.

A wrong path, bucket or credential fails here in seconds (:class:`~operators.exceptions.ArealConfigError`,
no retries) with every failed check and its fix, instead of hours into training. The report goes to XCom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from operators.hooks.storage import StorageHook

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ValidateStorageOperator"]


class ValidateStorageOperator(BaseOperator):
    """Check ``storage_url`` (path, ``file://``, ``s3://``) with fsspec ``options``; XCom: the report dict.

    :param min_free_gb: free space required on a local/NFS path (None: report only).
    :param nodes: nodes of the run (a multi-node check needs a probe runner; only 1 is supported here).
    """

    template_fields = ("storage_url", "options")
    ui_color = "#e8f0d8"

    def __init__(
        self,
        *,
        storage_url: str,
        options: dict[str, Any] | None = None,
        min_free_gb: float | None = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.storage_url = storage_url
        self.options = options
        self.min_free_gb = min_free_gb

    def execute(self, context: Context) -> dict[str, Any]:
        report = StorageHook(self.storage_url, self.options or {}).validate(min_free_gb=self.min_free_gb)
        self.log.info("storage %s is usable (%s)", report["url"], report["summary"])
        return report
