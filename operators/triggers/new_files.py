"""``NewDataFileTrigger``: an event trigger that fires once per new data file under a storage URL.

Used through Airflow 3's ``AssetWatcher`` (``dags/areal_scheduled_retraining.py``): the triggerer
runs :meth:`NewDataFileTrigger.run`, and every event it yields becomes an event of the watched Asset
with ``extra = {"from_trigger": True, "payload": <the event's payload>}``. The payload is::

    {"dataset": <the new file, as a dataset.path value>, "url": <its URL>, "key": <its key under the
     prefix>, "size": <bytes>}

so ``payload.dataset`` is what the retraining DAG trains on (``dataset.path``): the local path for a
local or ``file://`` prefix, else the file's URL.

Which files count (the rules, in order):

* the file is below ``url`` (a prefix: local path, ``file://`` or ``s3://``, listed through the
  ``storage`` package, recursively) and its name matches the glob ``pattern`` (default ``*.jsonl``);
* no part of its key starts with ``.`` or ``_`` (hidden and temporary names: ``storage``'s atomic
  writes stage to ``.tmp-*``, Spark and Hadoop write ``_temporary/`` and ``_SUCCESS``), so a file
  that is still being uploaded under a temporary name never fires, only its final name does;
* it was not there at the first listing (files present when the watch starts are old data);
* it is complete: non-empty, and of the same size in two consecutive listings (a file written in
  place appears while it grows; an S3 object appears whole, one poll later).

Each such file fires exactly once while the trigger runs. A prefix that does not exist (yet) is
not fatal: the trigger logs one error naming the URL and keeps polling, and every file that appears
once the prefix exists is new. Any other listing failure (credentials, a bad URL) fails the trigger
with an :class:`~operators.exceptions.ArealAirflowError` naming the URL. Departure from a durable
watch: the set of seen files lives in memory, so after a triggerer restart the files then present
are the new baseline (a file landing while no triggerer runs does not fire).
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from operators.exceptions import ArealAirflowError

__all__ = ["NewDataFileTrigger", "is_candidate"]


def is_candidate(key: str, pattern: str) -> bool:
    """Whether the file at ``key`` (relative to the watched prefix) may fire: its name matches
    ``pattern`` and no part of the key is hidden or temporary (starts with ``.`` or ``_``)."""
    parts = [p for p in key.split("/") if p]
    if not parts or any(p.startswith((".", "_")) for p in parts):
        return False
    return fnmatch.fnmatchcase(parts[-1], pattern)


class NewDataFileTrigger(BaseEventTrigger):
    """Watch ``url`` (a prefix) every ``poll_interval`` seconds; yield one event per new complete
    file whose name matches ``pattern`` (see the module docstring). ``options`` are the storage's
    fsspec options (S3 endpoint, region...; credentials come from the environment)."""

    def __init__(
        self,
        url: str,
        pattern: str = "*.jsonl",
        poll_interval: float = 30.0,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not url:
            raise ArealAirflowError("NewDataFileTrigger needs a storage URL to watch (a path, file://... or s3://...)")
        self.url = str(url)
        self.pattern = pattern
        self.poll_interval = float(poll_interval)
        self.options = dict(options or {})

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"url": self.url, "pattern": self.pattern, "poll_interval": self.poll_interval, "options": self.options},
        )

    def _list(self) -> dict[str, int] | None:
        """Every candidate file under the prefix -> its size; None when the prefix does not exist."""
        from storage import Storage, StorageError, StorageNotFoundError

        try:
            store = Storage.from_url(self.url, self.options)
            store.fs.invalidate_cache()  # s3fs caches listings: every poll must see the bucket as it is
            if not store.exists():
                return None
            files = store.walk_files()
        except StorageNotFoundError:
            return None
        except StorageError as exc:
            raise ArealAirflowError(f"cannot list the training-data prefix {self.url}: {exc}") from exc
        return {key: size for key, size in files.items() if is_candidate(key, self.pattern)}

    def _locate(self, key: str) -> tuple[str, str]:
        """``(dataset, url)`` of the file at ``key``: its ``dataset.path`` value (a local path for
        local storage) and its URL."""
        from storage import Storage

        store = Storage.from_url(self.url, self.options)
        return (store.fs_path(key) if store.is_local else store.url_for(key)), store.url_for(key)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        first = await asyncio.to_thread(self._list)
        missing_logged = False
        if first is None:
            self.log.error(
                "the training-data prefix %s does not exist: waiting for it (every file that appears in it is new)",
                self.url,
            )
            missing_logged = True
        seen: set[str] = set(first or {})
        self.log.info("watching %s for new %s files (%d present at start)", self.url, self.pattern, len(seen))
        pending: dict[str, int] = {}  # new files seen once: key -> size at that listing
        while True:
            await asyncio.sleep(self.poll_interval)
            listing = await asyncio.to_thread(self._list)
            if listing is None:
                if not missing_logged:
                    self.log.error("the training-data prefix %s does not exist (any more): waiting for it", self.url)
                    missing_logged = True
                continue
            missing_logged = False
            for key, size in sorted(listing.items()):
                if key in seen:
                    continue
                if size > 0 and pending.get(key) == size:
                    seen.add(key)
                    pending.pop(key)
                    dataset, url = self._locate(key)
                    self.log.info("new training data: %s (%d bytes)", url, size)
                    yield TriggerEvent({"dataset": dataset, "url": url, "key": key, "size": size})
                else:
                    pending[key] = size  # first sighting, or still growing: look again next poll
            for key in set(pending) - set(listing):
                pending.pop(key)  # removed (or renamed) before it was complete
