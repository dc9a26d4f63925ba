"""Data on a real S3-compatible server (the session's SeaweedFS): a parquet shard glob loaded with
``dataset.options``, a JSONL file read with the AWS environment alone, a stream, and a missing key."""

from __future__ import annotations

import io
import json

import pytest

from areal_tasks.config.sections import ColumnsConfig, DatasetConfig
from areal_tasks.datasets.registry import load_split, stream_records
from areal_tasks.errors import ConfigError

pytestmark = pytest.mark.usefixtures("no_stream_sleep")

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(6)]
COLUMNS = ColumnsConfig(prompt="question")


def _parquet(rows: list[dict]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def test_s3_shards_load_and_stream_with_the_storage_options(s3_server, s3_storage, s3_bucket, monkeypatch) -> None:
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    s3_storage.write_bytes("data/train-0.parquet", _parquet(ROWS[:3]))
    s3_storage.write_bytes("data/train-1.parquet", _parquet(ROWS[3:]))
    s3_storage.write_text("data/eval.jsonl", "".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    base = f"s3://{s3_bucket}/run/data"
    cfg = DatasetConfig(path=f"{base}/train-*.parquet", columns=COLUMNS, options=s3_server.storage_options())
    assert [r.prompt for r in load_split(cfg, "train")] == [r["question"] for r in ROWS]
    streamed = stream_records(f"{base}/train-*.parquet", columns=COLUMNS, options=s3_server.storage_options())
    assert [r.prompt for r in streamed.epoch(0, seed=0, shuffle=False)] == [r["question"] for r in ROWS]
    with pytest.raises(ConfigError, match="train-9.parquet' does not exist"):
        load_split(DatasetConfig(path=f"{base}/train-9.parquet", options=s3_server.storage_options()), "train")
    # the AWS environment alone reaches it too (options empty), as for checkpoints
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    eval_cfg = DatasetConfig(path="demo:arithmetic", eval_path=f"{base}/eval.jsonl", columns=COLUMNS)
    assert [r.answer for r in load_split(eval_cfg, "eval")] == ["0", "1"]
