"""``areal_scheduled_retraining`` end to end: a data file lands, the Asset's watcher fires, the DAG
retrains the registry's champion on that file, evaluates the result and moves ``champion`` only on
a strict improvement of the gate metric.

A champion is seeded cheaply: the demo config's tiny model (built by the model kit, no training) is
registered in MLflow (SQLite) as a pointer model with a chosen ``eval/reward``, the ``areal.model_dir``
tag naming its HF directory. Two DAG runs, each on a new JSONL file (16 demo prompts) landing in the
watched directory while the watcher runs (:mod:`tests.fixtures.asset_dag_runner`), 2 RL steps of 16
samples, 4 eval prompts:

1. the champion's seeded reward is -1 (below any reward): the candidate strictly beats it and
   becomes ``champion``;
2. a new champion is seeded at 1.0 (the largest reward): the candidate cannot strictly beat it (at
   best it ties), so ``champion`` stays and the candidate only gets ``candidate``.

Each run checks that the event's payload named the new file (not the earlier one), that the job
trained on it (``dataset.path`` in the job's ``config.yaml``) starting from the champion's model,
and that the evaluation ran. Wall times are printed (``-s``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.asset_dag_runner import run_asset_dag_test
from tests.fixtures.dag_runner import dag_env

pytestmark = [pytest.mark.airflow, pytest.mark.integration, pytest.mark.slow]

DAG_ID = "areal_scheduled_retraining"
MODEL_NAME = "areal-retrain-policy"
GATE = "eval/reward"
RL_STEPS = 2
DEMO = "demo:arithmetic?digits=2&ops=>&n_train=16&n_eval=4&seed={seed}"
#: the demo config's model (configs/demo_grpo.yaml), built untrained.
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2}


def write_jsonl(path: Path, spec: str, split: str) -> Path:
    from areal_tasks.datasets.registry import load_records

    rows = [{"prompt": r.prompt, "answer": r.answer} for r in load_records(spec, split)]  # type: ignore[arg-type]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def seed_champion(tracking_uri: str, model_dir: Path, reward: float) -> str:
    """Register ``model_dir`` as a new version with ``eval/reward = reward`` and make it champion."""
    from mlflow import MlflowClient

    from operators.hooks.mlflow import MlflowHook

    hook = MlflowHook(tracking_uri)
    run_id = hook.start_run("areal-retrain-seed", run_name=f"seed-{reward}")
    uri = hook.log_checkpoint_model(run_id, f"file://{model_dir}", {GATE: reward}, name="seed", step=0)
    version = hook.register(uri, MODEL_NAME, {GATE: reward}, GATE, tags={"areal.model_dir": str(model_dir)})["version"]
    MlflowClient(tracking_uri=tracking_uri).set_registered_model_alias(MODEL_NAME, "champion", version)
    hook.end_run(run_id)
    return str(version)


def aliases(tracking_uri: str) -> dict[str, str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    return {a: str(client.get_model_version_by_alias(MODEL_NAME, a).version) for a in ("champion", "candidate")}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("airflow", reason="Airflow is not installed: pip install -e '.[airflow]'")
    pytest.importorskip("mlflow", reason="MLflow is not installed: pip install -e '.[tracking]'")
    from areal_tasks.models import build_tiny_model

    base = tmp_path_factory.mktemp("retrain_e2e")
    watch = base / "landing"
    watch.mkdir()
    tracking_uri = f"sqlite:///{base / 'mlflow.db'}"
    env = dag_env(
        base,
        tracking_uri,
        {
            "AREAL_TRAINING_DATA_URI": f"file://{watch}",
            "AREAL_TRAINING_DATA_POLL_S": "0.5",
            # only an unpaused DAG's Asset gets its watcher's trigger row
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        },
    )
    return {
        "base": base,
        "watch": watch,
        "tracking_uri": tracking_uri,
        "env": env,
        "model_dir": Path(build_tiny_model("qwen2", seed=1, **TINY)),
        "eval": write_jsonl(base / "eval.jsonl", DEMO.format(seed=9), "eval"),
    }


def retrain(setup: dict[str, Any], name: str, seed: int) -> dict[str, Any]:
    """Land ``<name>.jsonl`` while the watcher runs and run the DAG on its event."""
    run_base = setup["base"] / name
    run_base.mkdir()
    data = write_jsonl(run_base / "source.jsonl", DEMO.format(seed=seed), "train")
    landing = setup["watch"] / f"{name}.jsonl"
    conf = {
        "config": "configs/demo_grpo.yaml",
        "run_dir": str(run_base / "run"),
        "max_steps": RL_STEPS,
        "eval_prompts": 4,
        "registered_model_name": MODEL_NAME,
        "extra_overrides": ["train.batch_size=16", f"dataset.eval_path={setup['eval']}"],
    }
    report = run_asset_dag_test(run_base, DAG_ID, conf, setup["env"], data, landing)
    print(
        f"\n[retraining_e2e] {name}: watcher fired after {report['fired_s']:.1f} s, "
        f"whole child {report['wall_s']:.0f} s (log {run_base / 'dag_test.log'})"
    )
    report["landing"] = landing
    report["job_config"] = yaml.safe_load((run_base / "run" / "config.yaml").read_text())
    return report


def check_run(report: dict[str, Any], model_dir: Path) -> None:
    tasks = report["tasks"]
    expected = ["start_from_champion", "resolve_job", "train", "evaluate_checkpoint[0]", "register_model"]
    failed = {t: tasks.get(t) for t in expected if tasks.get(t) != "success"}
    assert not failed, f"tasks not successful: {failed}\n{report['log'][-6000:]}"
    assert report["state"].endswith("success")
    # the watcher's event named the landed file, and the job trained on it from the champion
    assert report["payload"]["dataset"] == str(report["landing"]), report["payload"]
    assert report["extra"]["from_trigger"] is True and report["extra"]["payload"] == report["payload"]
    assert report["job_config"]["dataset"]["path"] == str(report["landing"])
    assert report["job_config"]["model"]["path"] == str(model_dir)
    assert report["job_config"]["train"]["sft_warmup_steps"] == 0


def test_new_data_retrains_and_the_gate_moves_champion_only_on_strict_improvement(setup: dict[str, Any]) -> None:
    tracking_uri = setup["tracking_uri"]
    low = seed_champion(tracking_uri, setup["model_dir"], reward=-1.0)
    first = retrain(setup, "day1", seed=1)
    check_run(first, setup["model_dir"])
    after_first = aliases(tracking_uri)
    assert after_first["champion"] == after_first["candidate"] != low, after_first  # strictly better: promoted

    high = seed_champion(tracking_uri, setup["model_dir"], reward=1.0)
    second = retrain(setup, "day2", seed=2)
    check_run(second, setup["model_dir"])  # fired for day2.jsonl only: day1.jsonl was there at the start
    after_second = aliases(tracking_uri)
    assert after_second["champion"] == high, after_second  # not strictly better: champion kept
    assert after_second["candidate"] not in (high, after_first["candidate"]), after_second
