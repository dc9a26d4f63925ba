"""Data files through HF ``datasets``: every format and layout, the column mapping, and hostile inputs
(missing file, wrong column, empty set, non-string prompt, corrupt parquet, unknown format) that each
give a ConfigError naming what is wrong and how to fix it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from areal_tasks.config.sections import ColumnsConfig, DatasetConfig
from areal_tasks.datasets.registry import Record, load_records, load_split
from areal_tasks.errors import ConfigError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets")

GSM8K = [{"question": f"What is {i} + 1?", "answer": f"{i} plus one.\n#### {i + 1}"} for i in range(4)]
GSM8K_COLUMNS = ColumnsConfig(prompt="question", answer="answer")


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_gsm8k_style_parquet_maps_question_to_the_prompt(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "train.parquet", GSM8K)
    records = load_records(str(path), columns=GSM8K_COLUMNS)
    assert records == [Record(r["question"], r["answer"]) for r in GSM8K]
    assert load_records(f"file://{path}", columns=GSM8K_COLUMNS) == records


def test_jsonl_with_prompt_and_answer_needs_no_mapping_and_json_arrow_and_saved_dirs_load(tmp_path: Path) -> None:
    rows = [{"prompt": "2+2?", "answer": 4}, {"prompt": "3+3?", "answer": 6}]  # numbers become text
    want = [Record("2+2?", "4"), Record("3+3?", "6")]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.json").write_text(json.dumps(rows))
    assert load_records(str(tmp_path / "a.jsonl")) == want
    assert load_records(str(tmp_path / "a.json")) == [Record("2+2?", "4"), Record("3+3?", "6")]
    table = pa.Table.from_pylist([{"prompt": r["prompt"], "answer": str(r["answer"])} for r in rows])
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert load_records(str(tmp_path / "b.arrow")) == want
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    assert load_records(str(tmp_path / "saved")) == want


def test_globs_and_directories_of_shards_read_every_shard_in_name_order(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    write_parquet(tmp_path / "shards" / "part-1.parquet", GSM8K[2:])
    write_parquet(tmp_path / "shards" / "part-0.parquet", GSM8K[:2])
    (tmp_path / "shards" / "README").write_text("not data")  # ignored: only data suffixes count
    want = [r["question"] for r in GSM8K]
    assert [r.prompt for r in load_records(str(tmp_path / "shards"), columns=GSM8K_COLUMNS)] == want
    glob = str(tmp_path / "shards" / "part-*.parquet")
    assert [r.prompt for r in load_records(glob, columns=GSM8K_COLUMNS)] == want
    (tmp_path / "shards" / "extra.jsonl").write_text(json.dumps(GSM8K[0]) + "\n")
    with pytest.raises(ConfigError, match=r"mixes formats \(\.jsonl, \.parquet\); keep one format per set"):
        load_records(str(tmp_path / "shards"), columns=GSM8K_COLUMNS)


def test_chat_messages_tests_and_metadata_columns(tmp_path: Path) -> None:
    rows = [
        {
            "chat": [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "add(a, b)"}],
            "unit_tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
            "source": "mbpp",
            "difficulty": 1,
        }
    ]
    path = write_parquet(tmp_path / "code.parquet", rows)
    columns = ColumnsConfig(messages="chat", answer=None, tests="unit_tests", metadata=["source", "difficulty"])
    (record,) = load_records(str(path), columns=columns)
    assert record.prompt == "add(a, b)" and record.answer == ""
    assert record.messages == tuple(rows[0]["chat"])
    assert record.tests == "assert add(1, 2) == 3\nassert add(0, 0) == 0"
    assert record.metadata == {"source": "mbpp", "difficulty": 1}
    one = dataclasses.replace(columns, metadata="source")
    assert load_records(str(path), columns=one)[0].metadata == {"source": "mbpp"}


def test_eval_path_file_yields_its_records_through_load_split(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "test.parquet", GSM8K[:2])
    cfg = DatasetConfig(path="demo:arithmetic", columns=GSM8K_COLUMNS)
    records = load_split(dataclasses.replace(cfg, eval_path=str(path)), "eval")
    assert [r.prompt for r in records] == [r["question"] for r in GSM8K[:2]]
    with pytest.raises(ConfigError, match="eval_path is not set"):
        load_split(dataclasses.replace(cfg, path=str(path)), "eval")


@pytest.mark.parametrize(
    ("make", "columns", "message"),
    [
        (lambda d: d / "missing.parquet", None, r"missing.parquet' does not exist"),
        (
            lambda d: write_parquet(d / "w.parquet", GSM8K),
            None,
            r"no column for dataset.columns.prompt='prompt'; its columns are \['question', 'answer'\].*"
            r"dataset.columns.prompt=question",
        ),
        (
            lambda d: write_parquet(d / "w.parquet", GSM8K),
            ColumnsConfig(prompt="question", tests="tests"),
            r"no column for dataset.columns.tests='tests'",
        ),
        (lambda d: _text(d / "e.jsonl", ""), None, r"e.jsonl' holds no records"),
        (lambda d: write_parquet(d / "e.parquet", GSM8K[:0]), GSM8K_COLUMNS, r"e.parquet' holds no records"),
        (
            lambda d: write_parquet(d / "n.parquet", [{"prompt": 7, "answer": "7"}]),
            None,
            r"row 1: column 'prompt' \(dataset.columns.prompt\) holds int 7; expected non-empty text",
        ),
        (
            lambda d: write_parquet(d / "m.parquet", [{"chat": "hi", "answer": "1"}]),
            ColumnsConfig(messages="chat"),
            r"column 'chat' \(dataset.columns.messages\) holds str 'hi'; expected a non-empty list of",
        ),
        (lambda d: _text(d / "c.parquet", "PAR1 this is not a parquet file"), None, r"c.parquet' cannot be read"),
        (lambda d: _text(d / "d.csv", "prompt,answer\n1,2\n"), None, r"unsupported format \.csv; supported: \.parquet"),
        (lambda d: _mkdir(d / "empty_dir"), None, r"directory without data files"),
        (lambda d: _text(d / "bad.jsonl", '{"prompt": "a", "answer": "b"}\nnot json\n'), None, "cannot be read"),
    ],
    ids=[
        "missing",
        "wrong-column",
        "missing-tests",
        "empty",
        "empty-parquet",
        "non-string",
        "bad-chat",
        "corrupt",
        "csv",
        "no-data",
        "bad-json",
    ],
)
def test_hostile_inputs_give_a_config_error_naming_the_problem(tmp_path, make, columns, message) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_records(str(path), columns=columns)


def test_a_save_to_disk_dict_of_splits_asks_for_one_split(tmp_path: Path) -> None:
    split = datasets.Dataset.from_list([{"prompt": "a", "answer": "b"}])
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"several splits \['test', 'train'\]; point the path at one of them"):
        load_records(str(tmp_path / "dd"))
    assert load_records(str(tmp_path / "dd" / "train")) == [Record("a", "b")]


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path
