"""The rollout data position survives a checkpoint: save mid-pass with records in flight, restore into a
fresh source and get the same continuation (pending records first), for a loaded set and a stream,
shuffled or not; the prompt-length filter drops at read time and says how many."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from areal_tasks.config.sections import DatasetConfig
from areal_tasks.datasets.registry import stream_records, train_data
from areal_tasks.errors import ConfigError
from areal_tasks.rollout.data_source import DataSource
from areal_tasks.rollout.stream_source import StreamingDataSource, data_source_for

pytestmark = pytest.mark.usefixtures("no_stream_sleep")

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

N = 23


@pytest.fixture
def shards(tmp_path: Path) -> str:
    """Three parquet shards of ``N`` prompts ``p0..p22`` in all."""
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(N)]
    for k, chunk in enumerate((rows[:8], rows[8:15], rows[15:])):
        pq.write_table(pa.Table.from_pylist(chunk), tmp_path / f"part-{k}.parquet")
    return str(tmp_path)


def _take(source, n: int) -> list[tuple[tuple[int, int], str]]:
    return [(pos, rec.prompt) for pos, rec in (source.next() for _ in range(n))]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("streaming", [False, True])
def test_state_saved_mid_pass_resumes_to_the_same_continuation(shards: str, streaming: bool, shuffle: bool) -> None:
    cfg = DatasetConfig(path=shards, streaming=streaming, shuffle=shuffle)

    def fresh():
        source = data_source_for(train_data(cfg), seed=7, shuffle=shuffle)
        assert isinstance(source, StreamingDataSource if streaming else DataSource)
        return source

    straight = fresh()
    first_pass = _take(straight, N)
    assert sorted(p for _, p in first_pass) == sorted(f"p{i}" for i in range(N))  # each prompt once per pass
    assert ([p for _, p in first_pass] != [f"p{i}" for i in range(N)]) == shuffle
    second = _take(straight, 5)
    assert [pos for pos, _ in second] == [(1, i) for i in range(5)]

    source = fresh()
    handed = _take(source, 12)
    pending = [handed[3][0], handed[10][0]]  # two groups still in flight at the checkpoint
    state = json.loads(json.dumps(source.state_dict(pending)))
    resumed = fresh()
    resumed.load_state_dict(state)
    # the pending records come back first (same positions, same prompts), then the pass goes on
    assert _take(resumed, 2) == [handed[3], handed[10]]
    assert _take(resumed, N - 12 + 5) == first_pass[12:] + second


def test_a_stream_state_does_not_load_into_a_loaded_source_and_vice_versa(shards: str) -> None:
    stream = data_source_for(stream_records(shards), seed=1, shuffle=False)
    loaded = data_source_for(train_data(DatasetConfig(path=shards)), seed=1, shuffle=False)
    with pytest.raises(ConfigError, match="saved for a streamed dataset"):
        loaded.load_state_dict(stream.state_dict())
    with pytest.raises(ConfigError, match="saved for a loaded"):
        stream.load_state_dict(loaded.state_dict())
    other_seed = data_source_for(stream_records(shards), seed=2, shuffle=False)
    with pytest.raises(ConfigError, match="same order"):
        other_seed.load_state_dict(stream.state_dict())


@pytest.mark.parametrize("streaming", [False, True])
def test_too_long_prompts_are_dropped_when_read_and_counted(shards: str, streaming: bool, caplog) -> None:
    cfg = DatasetConfig(path=shards, streaming=streaming, shuffle=False)
    keep = lambda record: int(record.answer) % 2 == 0  # noqa: E731 - "fits" for even prompts only
    with caplog.at_level(logging.INFO, logger="areal_tasks.datasets"):
        source = data_source_for(train_data(cfg, keep), seed=0, shuffle=False)
        got = [source.next()[1].prompt for _ in range(13)]
    assert got == [f"p{i}" for i in range(0, N, 2)] + ["p0"]  # 12 kept, then the next pass
    assert "dropped 11 of 23 prompts" in caplog.text
    with pytest.raises(ConfigError, match="every"):
        source = data_source_for(train_data(cfg, lambda record: False), seed=0, shuffle=False)
        source.next()
