"""The column mapping: which column of a data row holds the prompt (or chat), answer, tests, metadata, images.

:class:`RecordMapper` turns ``dataset.columns`` (:class:`~areal_tasks.config.sections.ColumnsConfig`)
into a row -> :class:`~areal_tasks.datasets.registry.Record` conversion. It checks a source's column
names up front (a ConfigError naming the missing column, the columns there are and the setting to
change) and every row's values as it converts them (a prompt must be text, a chat a list of
``{role, content}`` messages, an answer text or a number, tests text or a list of texts, images
what :func:`~areal_tasks.datasets.images.image_list` reads: an HF ``Image`` feature, bytes, or file
paths relative to the data's folder), so a bad file fails at load time with the row number rather
than in an episode. Torch-free.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.config.sections import ColumnsConfig
    from areal_tasks.datasets.registry import Record

logger = logging.getLogger(__name__)

__all__ = ["ROLES", "RecordMapper"]

#: the roles a column can be mapped to (the fields of ``dataset.columns``).
ROLES = ("prompt", "messages", "answer", "tests", "metadata", "images")


def local_folder(source: str) -> Path | None:
    """The local folder relative image paths of ``source`` (a ``dataset.path``) are resolved against:
    the data file's folder, the directory itself, or a glob's fixed head; None for remote data."""
    if "://" in source and not source.startswith("file://"):
        return None
    path = Path(source.removeprefix("file://")).expanduser()
    parts = path.parts
    for i, part in enumerate(parts):
        if set(part) & set("*?["):
            return Path(*parts[:i]) if i else Path(".")
    return path if path.is_dir() else path.parent


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class RecordMapper:
    """Converts rows of ``source`` (a path or URL, named in errors) to records by ``columns``."""

    def __init__(self, columns: ColumnsConfig, source: str) -> None:
        self.source = source
        #: ``role -> column`` of the text roles in use (``messages`` replaces ``prompt``).
        self.roles: dict[str, str] = {}
        if columns.messages is not None:
            self.roles["messages"] = columns.messages
        elif columns.prompt is not None:
            self.roles["prompt"] = columns.prompt
        else:
            raise ConfigError("dataset.columns: name a prompt column (prompt) or a chat column (messages)")
        for role in ("answer", "tests"):
            if getattr(columns, role) is not None:
                self.roles[role] = getattr(columns, role)
        if "answer" not in self.roles and "tests" not in self.roles:
            raise ConfigError("dataset.columns: name an answer column (answer) or a tests column (tests)")
        metadata = columns.metadata
        #: the metadata column(s); one column given as a string passes its value (a mapping) as is.
        self.metadata: list[str] = [metadata] if isinstance(metadata, str) else list(metadata or [])
        self.metadata_single = isinstance(metadata, str)
        #: the column of the prompt's images (one image or a list per row), or None.
        self.images: str | None = columns.images
        self.base_dir = local_folder(source) if self.images is not None else None

    @property
    def needed(self) -> list[str]:
        """Every column the mapping reads (in role order, no repeats)."""
        images = [self.images] if self.images is not None else []
        return list(dict.fromkeys([*self.roles.values(), *self.metadata, *images]))

    def check_columns(self, available: Iterable[str]) -> None:
        """ConfigError naming each mapped column ``available`` lacks, the columns it has, and the fix."""
        have = list(available)
        missing = [
            (role, column)
            for role, column in [
                *self.roles.items(),
                *(("metadata", c) for c in self.metadata),
                *([("images", self.images)] if self.images is not None else []),
            ]
            if column not in have
        ]
        if missing:
            wanted = "; ".join(f"dataset.columns.{role}={column!r}" for role, column in missing)
            role, column = missing[0]
            guess = (difflib.get_close_matches(column, have, n=1) or have or ["<column>"])[0]
            raise ConfigError(
                f"{self.source}: no column for {wanted}; its columns are {have}. Map each role to one of "
                f"them, e.g. dataset.columns.{role}={guess} (see docs/datasets.md)"
            )

    def record(self, row: Mapping[str, Any], where: str) -> Record:
        """The record of one row (``where`` names it in errors, e.g. ``row 7``)."""
        from areal_tasks.datasets.registry import Record

        if not all(column in row for column in self.needed):
            self.check_columns(row.keys())
        messages = None
        if "messages" in self.roles:
            messages = self._messages(row[self.roles["messages"]], where)
            users = [m["content"] for m in messages if m["role"] == "user"]
            prompt = users[-1] if users else messages[-1]["content"]
        else:
            prompt = row[self.roles["prompt"]]
            if not isinstance(prompt, str) or not prompt.strip():
                raise self._bad(where, "prompt", prompt, "non-empty text")
        answer = ""
        if "answer" in self.roles:
            answer = self._answer(row[self.roles["answer"]], where)
        tests = None
        if "tests" in self.roles:
            tests = self._tests(row[self.roles["tests"]], where)
        metadata = self._metadata(row) if self.metadata else None
        images = self._images(row[self.images], where) if self.images is not None else ()
        return Record(prompt, answer, messages=messages, tests=tests, metadata=metadata, images=images)

    # -- per-role checks -------------------------------------------------------------------------

    def _bad(self, where: str, role: str, value: Any, expected: str) -> ConfigError:
        column = self.roles.get(role, role)
        return ConfigError(
            f"{self.source} {where}: column {column!r} (dataset.columns.{role}) holds "
            f"{type(value).__name__} {_shown(value)}; expected {expected}"
        )

    def _messages(self, value: Any, where: str) -> tuple[dict[str, Any], ...]:
        expected = "a non-empty list of {role, content} messages with text role and content"
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
            raise self._bad(where, "messages", value, expected)
        messages = []
        for message in value:
            if (
                not isinstance(message, Mapping)
                or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)
            ):
                raise self._bad(where, "messages", value, expected)
            messages.append({k: v for k, v in message.items() if v is not None})
        return tuple(messages)

    def _answer(self, value: Any, where: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self._bad(where, "answer", value, "text or a number")
        return str(value)

    def _tests(self, value: Any, where: str) -> str:
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, Sequence) and value and all(isinstance(t, str) for t in value):
            return "\n".join(value)
        raise self._bad(where, "tests", value, "test code as text, or a non-empty list of texts")

    def _images(self, value: Any, where: str) -> tuple[Any, ...]:
        from areal_tasks.datasets.images import image_list

        return image_list(
            value, f"{self.source} {where}: column {self.images!r} (dataset.columns.images)", self.base_dir
        )

    def _metadata(self, row: Mapping[str, Any]) -> dict[str, Any]:
        if self.metadata_single:
            value = row[self.metadata[0]]
            return dict(value) if isinstance(value, Mapping) else {self.metadata[0]: value}
        return {column: row[column] for column in self.metadata}
