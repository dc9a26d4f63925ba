"""fsspec storage for areal-tasks: one interface over local/NFS paths, S3 and memory, rooted at a URL.

Knows nothing of RL (it never imports ``areal_tasks``). The pieces:

* :class:`Storage` (``storage.storage``): read/write/list/delete/exists, atomic writes, retries.
* :mod:`storage.url` and :mod:`storage.options`: URLs plus options (and the AWS environment).
* :mod:`storage.commit`: atomic directory commits (stage, then a ``_COMMITTED`` marker).
* :func:`copy_tree` (``storage.copy``): copies between storages with a progress bar.
* :mod:`storage.retry`: backoff on transient errors only.
* :mod:`storage.validate`: pre-flight checks with a JSON report.
* :mod:`storage.errors`: ``StorageError`` and its subclasses.

Importing this package is cheap: s3fs/botocore load only when an ``s3://`` storage is built.
"""

from storage.commit import COMMIT_MARKER, list_uncommitted, read_commit, verify_commit
from storage.copy import CopyStats, copy_tree
from storage.errors import (
    CommitError,
    StorageConfigError,
    StorageConnectionError,
    StorageError,
    StorageIOError,
    StorageNotFoundError,
    StoragePermissionError,
    StorageTransientError,
    StorageValidationError,
)
from storage.retry import RetryPolicy, is_transient
from storage.storage import Storage, open_storage
from storage.url import StorageURL, parse_url

__all__ = [
    "COMMIT_MARKER",
    "CommitError",
    "CopyStats",
    "RetryPolicy",
    "Storage",
    "StorageConfigError",
    "StorageConnectionError",
    "StorageError",
    "StorageIOError",
    "StorageNotFoundError",
    "StoragePermissionError",
    "StorageTransientError",
    "StorageURL",
    "StorageValidationError",
    "copy_tree",
    "is_transient",
    "list_uncommitted",
    "open_storage",
    "parse_url",
    "read_commit",
    "verify_commit",
]
