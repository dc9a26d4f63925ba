"""Storage URLs: parse ``file://``, plain paths, ``s3://`` and ``memory://`` into one canonical form.

``StorageURL.path`` is the path the fsspec filesystem understands: an absolute POSIX path for
``file``, ``bucket/prefix`` for ``s3`` (no leading or trailing slash) and ``/name/...`` for
``memory``. ``str(url)`` gives the canonical URL back. Relative keys are joined with :meth:`join`,
which refuses to climb above the root (``..``).

A URL that carries a secret (``s3://KEY:SECRET@bucket/x``, a signed query string) is refused: it
would be echoed by every log line, error message, job record and ``ps`` listing that shows the
URL. Credentials come from the environment (``AWS_ACCESS_KEY_ID``...) or the storage options.
Messages show URLs through :func:`storage.redact.redact_url`.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from storage.errors import StorageConfigError
from storage.redact import redact_url

__all__ = ["SCHEMES", "Scheme", "StorageURL", "parse_url"]

Scheme = Literal["file", "s3", "memory"]

#: the URL schemes this package supports.
SCHEMES: tuple[Scheme, ...] = ("file", "s3", "memory")

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class StorageURL:
    """A parsed storage location (see the module docstring for what ``path`` holds per scheme)."""

    scheme: Scheme
    path: str

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.path}"
        if self.scheme == "s3":
            return f"s3://{self.path}"
        return f"memory:/{self.path}"  # path is "/name/...", so this reads memory://name/...

    @property
    def bucket(self) -> str:
        """The S3 bucket (``s3`` only)."""
        if self.scheme != "s3":
            raise StorageConfigError(f"{self} is not an s3:// URL; it has no bucket")
        return self.path.split("/", 1)[0]

    @property
    def key_prefix(self) -> str:
        """The key prefix inside the bucket, without a trailing slash (``s3`` only; may be empty)."""
        if self.scheme != "s3":
            raise StorageConfigError(f"{self} is not an s3:// URL; it has no key prefix")
        parts = self.path.split("/", 1)
        return parts[1] if len(parts) == 2 else ""

    @property
    def is_local(self) -> bool:
        """Whether the location is a path on a mounted filesystem (local disk, NFS, Lustre...)."""
        return self.scheme == "file"

    def join(self, relative: str) -> StorageURL:
        """The location ``relative`` (a ``/``-separated key) below this one; ``..`` may not leave it."""
        rel = normalize_key(relative)
        if not rel:
            return self
        joined = posixpath.join(self.path, rel) if self.path else rel
        return StorageURL(self.scheme, joined)


def normalize_key(relative: str) -> str:
    """``a//b/./c/`` -> ``a/b/c``; ``""`` stays ``""``. Absolute keys and keys climbing out are refused."""
    if relative in ("", ".", "/"):
        return ""
    if relative.startswith("/"):
        raise StorageConfigError(f"key {relative!r} must be relative to the storage root (no leading '/')")
    normalized = posixpath.normpath(relative)
    if normalized == ".":
        return ""
    if normalized == ".." or normalized.startswith("../"):
        raise StorageConfigError(f"key {relative!r} climbs above the storage root ('..' is not allowed there)")
    return normalized


def parse_url(url: str | os.PathLike[str]) -> StorageURL:
    """Parse a storage URL or a plain path (relative paths are made absolute against the cwd).

    Raises StorageConfigError for an empty URL, an unsupported scheme, a remote ``file://`` host,
    an invalid S3 bucket name or a URL that carries credentials.
    """
    text = os.fspath(url).strip()
    if not text:
        raise StorageConfigError("storage URL is empty; give a path, file://..., s3://bucket/prefix or memory://name")
    if "://" not in text:
        return StorageURL("file", _absolute(text))
    shown = redact_url(text)
    if shown != text:
        raise StorageConfigError(
            f"storage URL {shown!r} carries credentials (a password or a signature); a URL is shown in logs, "
            "errors, job records and `ps`, so it must not hold them. Give S3 credentials through the "
            "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or AWS_PROFILE) or the "
            "storage options key/secret (in a job config: storage.options, with the values in "
            "$AREAL_CONFIG_SECRETS), and use the plain s3://bucket/prefix"
        )
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise StorageConfigError(
                f"file URL {text!r} names host {parts.netloc!r}; use file:///absolute/path (three slashes) "
                "for a path on a mounted filesystem"
            )
        if not parts.path:
            raise StorageConfigError(f"file URL {text!r} has no path; use file:///absolute/path")
        return StorageURL("file", _absolute(parts.path))
    if scheme in ("s3", "s3a"):
        bucket, _, prefix = text.split("://", 1)[1].partition("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise StorageConfigError(
                f"S3 URL {text!r}: bucket name {bucket!r} is invalid (3-63 characters: lowercase letters, "
                "digits, '.', '-'; starting and ending with a letter or digit)"
            )
        key = posixpath.normpath(prefix.strip("/")) if prefix.strip("/") else ""
        if key == ".." or key.startswith("../"):
            raise StorageConfigError(f"S3 URL {text!r}: the key prefix may not climb with '..'")
        return StorageURL("s3", f"{bucket}/{key}" if key and key != "." else bucket)
    if scheme == "memory":
        rest = text.split("://", 1)[1].strip("/")
        return StorageURL("memory", "/" + posixpath.normpath(rest) if rest else "/")
    raise StorageConfigError(
        f"storage URL {text!r} has unsupported scheme {parts.scheme!r}; supported: "
        "a plain path, file://, s3:// and memory:// (tests)"
    )


def _absolute(path: str) -> str:
    return posixpath.normpath(os.path.abspath(os.path.expanduser(path)))
