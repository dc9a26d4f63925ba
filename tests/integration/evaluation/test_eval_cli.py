"""``areal eval`` end to end: the command serves the tiny model with a real embedded server (the
default ``rollout.backend``), evaluates two eval sets greedily and writes the summary and the
per-item JSONL; the summary's figures are those of the items it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from areal_tasks.evaluation import ItemResult, SampleResult, compute_metrics

pytestmark = pytest.mark.integration

KEYS = {"pass@1", "pass@2", "maj@2", "answer_rate", "mean_response_length", "n_items", "n_samples"}
MAX_NEW_TOKENS = 6


def test_areal_eval_on_a_real_embedded_server(tmp_path: Path, tiny_qwen2: Path, repo_root: Path) -> None:
    data = tmp_path / "larger.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"Which is larger, {a} or {b}?", "answer": str(max(a, b))}) + "\n"
            for a, b in [(3, 7), (9, 2), (5, 6)]
        )
    )
    out = tmp_path / "res.json"
    argv = [
        *(sys.executable, "-m", "areal_tasks.cli", "eval", "--model", str(tiny_qwen2)),
        *("--data", str(data), "--data", "demo:arithmetic?n_eval=2", "--n-samples", "2", "--temperature", "0"),
        *("--out", str(out), "--no-progress", f"experiment.run_dir={tmp_path / 'run'}"),
        f"rollout.sampling.max_new_tokens={MAX_NEW_TOKENS}",
    ]
    done = subprocess.run(argv, cwd=repo_root, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert json.loads(out.read_text()) == summary
    assert set(summary) >= KEYS | {"model", "data", "reward", "temperature", "wall_s", "sets", "items_file"}
    assert set(summary["sets"]) == {"larger", "arithmetic"}
    assert summary["n_items"] == 5 and summary["n_samples"] == 10 and summary["backend"] == "embedded"

    items = [json.loads(line) for line in Path(summary["items_file"]).read_text().splitlines()]
    assert [i["set"] for i in items] == ["larger"] * 3 + ["arithmetic"] * 2
    for item in items:
        assert item["completions"][0] == item["completions"][1]  # greedy: every sample is the same
        assert all(0 < n <= MAX_NEW_TOKENS for n in item["n_tokens"])
    rebuilt = compute_metrics(
        [
            ItemResult(
                i["item_id"],
                [SampleResult(c, a, n_tokens=n) for c, a, n in zip(i["correct"], i["answers"], i["n_tokens"])],
            )
            for i in items
        ],
        2,
    )
    for key in KEYS:
        assert summary[key] == pytest.approx(rebuilt.summary[key]), key
