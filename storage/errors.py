"""The storage package's exceptions: one root type, :class:`StorageError`, and a subclass per kind of failure.

The subclasses that mirror a builtin also derive from it (``StorageNotFoundError`` is a
``FileNotFoundError``, ``StoragePermissionError`` a ``PermissionError``), so code written against
plain ``open()`` keeps working. The original low-level exception (an ``OSError``, a botocore
``ClientError``...) is always chained as ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "CommitError",
    "StorageConfigError",
    "StorageConnectionError",
    "StorageError",
    "StorageIOError",
    "StorageNotFoundError",
    "StoragePermissionError",
    "StorageTransientError",
    "StorageValidationError",
]


class StorageError(Exception):
    """Root of every error raised by :mod:`storage`."""


class StorageConfigError(StorageError, ValueError):
    """A URL or an option is malformed or unsupported (a usage error: fix the input and retry)."""


class StorageNotFoundError(StorageError, FileNotFoundError):
    """The file, prefix or bucket does not exist."""


class StoragePermissionError(StorageError, PermissionError):
    """Access was refused: missing or invalid credentials, a read-only identity or filesystem."""


class StorageConnectionError(StorageError, ConnectionError):
    """The storage endpoint could not be reached at all (refused, unresolvable)."""


class StorageTransientError(StorageError):
    """A transient failure (timeout, reset, 5xx, throttling) that persisted through every retry."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class StorageIOError(StorageError, OSError):
    """Any other I/O failure reported by the backend."""


class CommitError(StorageError):
    """A directory commit could not be made (target already committed, staging left behind...)."""


class StorageValidationError(StorageError):
    """A pre-flight check failed. Names the check, the node it ran on, the path and how to fix it."""

    def __init__(self, check: str, node: str, path: str, message: str, fix: str) -> None:
        self.check = check
        self.node = node
        self.path = path
        self.message = message
        self.fix = fix
        super().__init__(f"[{check}] on {node} at {path}: {message} Fix: {fix}")
