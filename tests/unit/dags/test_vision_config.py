"""The training DAG takes configs/demo_vision_grpo.yaml: ``resolve_job`` validates it with the form's
Params, ``detect_model`` names the tiny Qwen2-VL, and the resolved job's workflow renders an eval
image prompt (what the ``train`` and ``evaluate_checkpoint`` tasks then run). The whole DAG on this
config is what tests/integration/airflow/test_dag_e2e.py does for the text demo; the vision run
itself is tests/integration/rl/test_vision_learning.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

DAGS = Path(__file__).resolve().parents[3] / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))  # as Airflow does: the DAG folder (bundle path) is on sys.path

pytest.importorskip("airflow", reason="Airflow is not installed: pip install -e '.[airflow]'")

import areal_dag_tasks as tasks  # noqa: E402

from operators.operators.model import DetectModelOperator  # noqa: E402
from tests.unit.operators.conftest import make_context  # noqa: E402

CONFIG = "configs/demo_vision_grpo.yaml"


def test_the_training_dag_resolves_detects_and_renders_the_vision_demo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from areal_tasks.api.inference import SamplingParams
    from areal_tasks.config import load_config
    from areal_tasks.datasets.registry import load_split
    from areal_tasks.models import build_tiny_model
    from areal_tasks.models.tokenizer import load_tokenizer
    from areal_tasks.rollout.side import workflow_of
    from tests.unit.rollout.workflow_fakes import arith_reward

    params: dict[str, Any] = {
        "config": CONFIG,
        "run_dir": str(tmp_path / "run"),
        "sft_steps": 10,
        "max_steps": 13,
        "eval_prompts": 4,
    }
    context = {"params": params, "dag": SimpleNamespace(dag_id="areal_rl_training"), "run_id": "manual__1"}
    monkeypatch.setattr(tasks, "get_current_context", lambda: context)
    job = tasks.resolve_job.function()
    assert job["model"] == "tiny:qwen2_vl" and job["dataset"].startswith("demo:shapes?")

    detected = DetectModelOperator(task_id="detect_model", model=job["model"], n_gpus=job["n_gpus"]).execute(
        make_context()
    )
    assert detected["architecture"] == "Qwen2VLForConditionalGeneration"

    cfg = load_config(job["resolved_config"], [])
    assert (cfg.train.sft_warmup_steps, cfg.train.total_steps, cfg.evaluation.max_eval_prompts) == (10, 13, 4)
    tokenizer = load_tokenizer(str(build_tiny_model("qwen2_vl", seed=cfg.experiment.seed)))
    workflow = workflow_of(cfg, tokenizer, SamplingParams(), arith_reward)
    record = load_split(cfg.dataset, "eval")[0]
    assert len(workflow.render_item(record)) <= cfg.dataset.max_prompt_len
