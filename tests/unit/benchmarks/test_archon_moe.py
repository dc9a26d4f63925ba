"""The archon MoE benchmark's CPU dry run: a tiny Qwen3-MoE, one warm-up and one timed step for
each engine that runs on the CPU (the per-expert loop and the FSDP engine), a table and a JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.archon_moe import PRESETS, active_params, main


def test_active_params_drop_the_skipped_experts() -> None:
    shape = PRESETS["tiny"]
    per_layer_expert = 3 * shape["hidden_size"] * shape["moe_intermediate_size"]
    skipped = shape["num_experts"] - shape["num_experts_per_tok"]
    assert active_params(10**6, shape) == 10**6 - shape["num_hidden_layers"] * skipped * per_layer_expert


@pytest.mark.timeout(300)
def test_dry_run_times_each_engine_on_the_same_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "archon_moe.json"
    result = main(["--dry-run", "--out", str(out), "--model-root", str(tmp_path / "models")])
    rows = result["results"]
    assert [r["engine"] for r in rows] == ["archon loop", "fsdp"]
    assert json.loads(out.read_text())["results"][0]["engine"] == "archon loop"
    assert len({r["params_total"] for r in rows}) == 1  # one model
    assert all(0 < r["params_active"] < r["params_total"] for r in rows)
    assert all(r["tokens_per_s"] > 0 and len(r["step_times_s"]) == 1 for r in rows)
    assert rows[0]["loss_last"] == pytest.approx(rows[1]["loss_last"], rel=1e-4)  # same batches, same weights
    assert "MFU spec" in capsys.readouterr().out
