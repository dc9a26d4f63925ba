"""``NewDataFileTrigger``: serialize() round-trips; run() fires once per new complete file whose name
matches the pattern (never for files present at the start, hidden/temporary names, or a file that
is still growing), keeps polling across a missing prefix (with one clear error), fails with the URL
named on other listing errors, and works on a real directory and on S3 (SeaweedFS)."""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from operators.exceptions import ArealAirflowError
from operators.triggers.new_files import NewDataFileTrigger, is_candidate


def drain(trigger: NewDataFileTrigger, n_events: int, between: Callable[[int], None], timeout: float = 20.0) -> list:
    """Run the trigger until it has yielded ``n_events`` (or ``timeout``); ``between(poll)`` runs
    before each poll's listing (the test's file operations)."""
    listing = trigger._list
    polls = {"n": 0}

    def scripted() -> Any:
        between(polls["n"])
        polls["n"] += 1
        return listing()

    trigger._list = scripted  # type: ignore[method-assign]

    async def go() -> list:
        events = []
        gen = trigger.run()
        try:
            while len(events) < n_events:
                events.append((await asyncio.wait_for(anext(gen), timeout)).payload)
        finally:
            await gen.aclose()
        return events

    return asyncio.run(go())


def no_event_within(trigger: NewDataFileTrigger, seconds: float) -> None:
    async def go() -> None:
        gen = trigger.run()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(anext(gen), seconds)
        finally:
            await gen.aclose()

    asyncio.run(go())


def test_serialize_round_trip() -> None:
    trigger = NewDataFileTrigger("s3://bucket/data", pattern="*.json*", poll_interval=5, options={"region": "x"})
    classpath, kwargs = trigger.serialize()
    assert classpath == "operators.triggers.new_files.NewDataFileTrigger"
    module, _, name = classpath.rpartition(".")
    assert getattr(importlib.import_module(module), name)(**kwargs).serialize() == (classpath, kwargs)
    json.dumps(kwargs)  # the triggerer stores the kwargs as JSON
    with pytest.raises(ArealAirflowError, match="storage URL"):
        NewDataFileTrigger("")


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("new.jsonl", True),
        ("2026/12/part-1.jsonl", True),
        ("notes.txt", False),
        (".tmp-abc.jsonl", False),  # storage's atomic writes stage here
        ("_temporary/0/part-1.jsonl", False),  # Spark / Hadoop output committers
        ("batch/.hidden.jsonl", False),
        ("_SUCCESS", False),
        ("new.jsonl.part", False),
    ],
)
def test_candidate_names(key: str, expected: bool) -> None:
    assert is_candidate(key, "*.jsonl") is expected


def test_fires_once_per_new_file_and_never_for_old_or_temporary_ones(tmp_path: Path) -> None:
    (tmp_path / "old.jsonl").write_text('{"a": 1}\n')

    def between(poll: int) -> None:
        if poll == 1:
            (tmp_path / "new1.jsonl").write_text('{"a": 2}\n')
            (tmp_path / ".tmp-x.jsonl").write_text('{"a": 3}\n')
            (tmp_path / "_temporary").mkdir()
            (tmp_path / "_temporary" / "y.jsonl").write_text('{"a": 4}\n')
            (tmp_path / "readme.txt").write_text("not data\n")
        if poll == 3:  # the upload under a temporary name completes: renamed to its final name
            (tmp_path / ".tmp-x.jsonl").rename(tmp_path / "new2.jsonl")

    trigger = NewDataFileTrigger(str(tmp_path), poll_interval=0.01)
    events = drain(trigger, 2, between)
    assert [e["key"] for e in events] == ["new1.jsonl", "new2.jsonl"]
    assert events[0] == {
        "dataset": f"{tmp_path}/new1.jsonl",
        "url": f"file://{tmp_path}/new1.jsonl",
        "key": "new1.jsonl",
        "size": 9,
    }
    # a new watch: everything now present is old, so nothing fires
    no_event_within(NewDataFileTrigger(str(tmp_path), poll_interval=0.01), 0.3)


def test_a_growing_file_fires_once_complete(tmp_path: Path) -> None:
    path = tmp_path / "grow.jsonl"

    def between(poll: int) -> None:
        if poll == 1:
            path.write_text("")  # created empty: never fires while empty
        elif 2 <= poll <= 4:
            with path.open("a") as handle:  # still being written at each listing
                handle.write(f'{{"n": {poll}}}\n')

    events = drain(NewDataFileTrigger(str(tmp_path), poll_interval=0.01), 1, between)
    assert events == [{"dataset": str(path), "url": f"file://{path}", "key": "grow.jsonl", "size": 27}]


def test_a_missing_prefix_is_waited_for_with_one_clear_error(tmp_path: Path, capsys) -> None:
    prefix = tmp_path / "not-yet"

    def between(poll: int) -> None:
        if poll == 5:
            prefix.mkdir()
            (prefix / "first.jsonl").write_text("{}\n")

    trigger = NewDataFileTrigger(str(prefix), poll_interval=0.01)
    events = drain(trigger, 1, between)
    assert [e["key"] for e in events] == ["first.jsonl"]  # present once the prefix exists: new
    # Airflow's structlog writes the trigger's log lines to stdout
    errors = [line for line in capsys.readouterr().out.splitlines() if "error" in line and "does not exist" in line]
    assert len(errors) == 1 and str(prefix) in errors[0], errors


def test_other_listing_failures_fail_with_the_url() -> None:
    trigger = NewDataFileTrigger("s3://", poll_interval=0.01)  # no bucket: a configuration error
    with pytest.raises(ArealAirflowError, match="s3://"):
        drain(trigger, 1, lambda poll: None)


@pytest.fixture
def s3_prefix(s3_server: Any, s3_bucket: str) -> Iterator[tuple[str, dict[str, Any], Any]]:
    from storage import Storage

    url = f"s3://{s3_bucket}/incoming"
    store = Storage.from_url(url, s3_server.storage_options())
    store.write_text("old.jsonl", "{}\n")
    yield url, s3_server.storage_options(), store


@pytest.mark.integration
def test_s3_new_object_fires_once(s3_prefix: tuple[str, dict[str, Any], Any]) -> None:
    url, options, store = s3_prefix

    def between(poll: int) -> None:
        if poll == 1:
            store.write_text("day2.jsonl", '{"q": 1}\n')

    events = drain(NewDataFileTrigger(url, poll_interval=0.05, options=options), 1, between, timeout=60)
    assert events == [{"dataset": f"{url}/day2.jsonl", "url": f"{url}/day2.jsonl", "key": "day2.jsonl", "size": 9}]
