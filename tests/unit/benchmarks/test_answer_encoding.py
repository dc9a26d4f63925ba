"""The answer-encoding benchmark: every length and kind timed both ways, the encodings checked to agree, a JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.answer_encoding import answer, chat_answer, main


def test_each_length_is_timed_both_ways_and_written(tmp_path: Path) -> None:
    out = tmp_path / "answer_encoding.json"
    report = main(["--tokens", "4,16", "--calls", "3", "--repeats", "1", "--out", str(out)])
    assert [row["tokens"] for row in report["rows"]] == [4, 16]
    for row in report["rows"]:
        assert row["bytes"] > 0
        assert all(row[key] > 0 for key in ("write_json_us", "write_msgspec_us", "read_json_us", "read_client_us"))
    assert [row["tokens"] for row in report["chat_rows"]] == [4, 16]
    assert all(row["write_fastapi_us"] > 0 and row["write_msgspec_us"] > 0 for row in report["chat_rows"])
    assert json.loads(out.read_text())["rows"] == report["rows"]


def test_the_answer_is_the_servers_with_its_log_probs() -> None:
    got = answer(5)
    assert len(got["output_ids"]) == 5 and got["meta_info"]["completion_tokens"] == 5
    assert [entry[1] for entry in got["meta_info"]["output_token_logprobs"]] == got["output_ids"]


def test_the_chat_answer_has_each_tokens_alternatives() -> None:
    content = chat_answer(3)["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(entry["top_logprobs"]) == 5 for entry in content)
