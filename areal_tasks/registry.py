"""A name -> implementation table for one kind of plug-in (engine, scheduler, weight transport...).

Each kind keeps one :class:`Registry` in its own package (``engine/registry.py``,
``launch/registry.py``, ...). Entries are ``"package.module:attr"`` strings, imported on first use,
or the objects themselves, so a registry module stays torch-free and listing the names (for
validation, DAG Params, docs tables) never imports a backend. An unknown name is refused with the
closest valid name and the full list, in the kind's own error type.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from areal_tasks.errors import AReaLError, ConfigError

logger = logging.getLogger(__name__)

__all__ = ["Registry", "load_target"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Named implementations of one ``kind`` of plug-in (``"engine backend"``, ``"scheduler"``...)."""

    def __init__(
        self, kind: str, entries: dict[str, str | T] | None = None, *, error: type[AReaLError] = ConfigError
    ) -> None:
        self.kind = kind
        self._entries: dict[str, str | T] = dict(entries or {})
        self._error = error

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def register(self, name: str, target: str | T, *, replace: bool = False) -> None:
        """Register ``target`` (an object or ``"module:attr"``) as ``name``; refuses a second
        registration of a name unless ``replace``."""
        if not name or not isinstance(name, str):
            raise self._error(f"a {self.kind} needs a non-empty name, got {name!r}")
        if name in self._entries and not replace:
            raise self._error(f"{self.kind} {name!r} is already registered; pass replace=True to override it")
        self._entries[name] = target

    def unregister(self, name: str) -> None:
        """Remove ``name`` (tests register temporary entries)."""
        self._entries.pop(name, None)

    def hint(self, name: object) -> str:
        """``did you mean 'x'? (known: a, b)``, or the known names alone."""
        known = ", ".join(self.names()) or "(none)"
        close = difflib.get_close_matches(str(name), self.names(), n=1, cutoff=0.5)
        return f"did you mean {close[0]!r}? (known: {known})" if close else f"known: {known}"

    def check(self, name: object) -> None:
        """Raise the kind's error unless ``name`` is registered."""
        if name not in self._entries:
            raise self._error(f"unknown {self.kind} {name!r}; {self.hint(name)}")

    def get(self, name: str) -> T:
        """The implementation of ``name`` (imported now if it was registered as a string)."""
        self.check(name)
        target = self._entries[name]
        if isinstance(target, str):
            target = load_target(target, f"{self.kind} {name!r}", self._error)
            self._entries[name] = target
        return target

    def build(self, name: str, *args: object, **kwargs: object) -> object:
        """``get(name)(*args, **kwargs)``: construct the implementation."""
        factory = self.get(name)
        if not callable(factory):
            raise self._error(f"{self.kind} {name!r} is registered as {factory!r}, which cannot be called")
        return factory(*args, **kwargs)


def load_target(path: str, what: str, error: type[AReaLError] = ConfigError) -> Callable[..., object]:
    """Import ``"package.module:attr"`` and return the attribute; ``error`` (naming ``what``) if it cannot.

    For registries whose entries describe more than one implementation (e.g. an inference backend's
    client adapter and its server launcher), each held as such a path.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise error(f"{what}: {path!r} is not an import path of the form package.module:attr")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"{what}: cannot import {module_name!r} ({exc})") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise error(f"{what}: {module_name!r} has no attribute {attr!r}") from None
