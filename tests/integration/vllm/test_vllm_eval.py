"""The evaluation harness through the session's vLLM server: greedy samples of a tiny eval set come
back through vLLM's API, are scored by the reward workers, and give a summary consistent with the
per-item records (greedy: every sample of an item is the same completion)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vllm_session import VLLMSession

from areal_tasks.config import load_config
from areal_tasks.evaluation import EvalOptions, sample_and_score
from areal_tasks.evaluation.report import build_run
from areal_tasks.evaluation.sets import load_sets
from areal_tasks.models.tokenizer import load_tokenizer

pytestmark = pytest.mark.integration


def test_harness_through_vllm(vllm: VLLMSession, tmp_path: Path) -> None:
    data = tmp_path / "larger.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"Which is larger, {a} or {b}?", "answer": str(b)}) + "\n"
            for a, b in [(3, 7), (2, 9)]
        )
    )
    cfg = load_config(
        None,
        [
            f"experiment.run_dir={tmp_path}",
            "allocation=vllm:d1+fsdp:d1",
            "rollout.backend=vllm",
            "rollout.sampling.max_new_tokens=6",
        ],
    )
    options = EvalOptions(n_samples=2, temperature=0.0).resolve(cfg)
    sets = load_sets(cfg, [str(data)])
    tokenizer = load_tokenizer(str(vllm.server.model_path))
    outcomes = sample_and_score(vllm.client(), tokenizer, cfg, sets, options, progress=False)
    run = build_run(outcomes, options, {"model": "vllm"})
    assert run.summary["n_items"] == 2 and run.summary["n_samples"] == 4 and run.summary["length_unit"] == "tokens"
    for item in run.items:
        assert item["completions"][0] == item["completions"][1] and 0 < item["n_tokens"][0] <= 6
    assert run.summary["pass@1"] == pytest.approx(sum(i["pass@1"] for i in run.items) / 2)
