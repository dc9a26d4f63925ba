"""The pre-flight and registry operators: storage validation (passing, failing fast without
retries), model detection from a real config.json with a layout recommendation, the local resource
check, the evaluation operator's checkpoint handling and MLflow record, and registration of the best
evaluation with champion gating against a real sqlite MLflow store."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from operators.exceptions import ArealAirflowError, ArealConfigError
from operators.operators import (
    DetectModelOperator,
    EvaluateCheckpointOperator,
    ProvisionClusterOperator,
    RegisterModelOperator,
    ValidateStorageOperator,
)
from operators.operators.evaluation import split_checkpoint_url
from operators.operators.registry import pick_best, resolve_evaluations
from tests.unit.operators.conftest import make_context

QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
}


def test_validate_storage_operator(tmp_path: Path) -> None:
    report = ValidateStorageOperator(task_id="v", storage_url=(tmp_path / "s").as_uri(), min_free_gb=None).execute(
        make_context()
    )
    assert report["ok"] and report["summary"]["fail"] == 0
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArealConfigError, match="local.path"):
        ValidateStorageOperator(task_id="v", storage_url=str(tmp_path / "file" / "sub")).execute(make_context())


def test_detect_model_operator(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN2_7B))
    out = DetectModelOperator(task_id="d", model=str(tmp_path), n_gpus="8").execute(make_context())
    assert out["architecture"] == "Qwen2ForCausalLM" and out["family"] == "qwen2"
    assert 7e9 < out["params"] < 8e9 and out["params"] == out["num_parameters"]
    assert out["allocation"] == out["recommended_layout"]["allocation"]
    assert out["recommended_layout"]["n_train_gpus"] + out["recommended_layout"]["n_inference_gpus"] == 8
    json.dumps(out)  # XCom-serialisable
    with pytest.raises(ArealAirflowError, match="cannot detect model"):
        DetectModelOperator(task_id="d", model=str(tmp_path / "missing")).execute(make_context())


def test_provision_cluster_operator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    op = ProvisionClusterOperator(
        task_id="p", allocation_mode="embedded:d1+fsdp:d2", n_gpus="0", min_memory_gb="0.01", jobs_root=str(tmp_path)
    )
    assert op.execute(make_context())["ok"]
    with pytest.raises(ArealAirflowError, match="needs 3 GPUs"):
        ProvisionClusterOperator(
            task_id="p", allocation_mode="sglang:d1+fsdp:d2", n_gpus=3, jobs_root=str(tmp_path)
        ).execute(make_context())
    with pytest.raises(ArealAirflowError, match="supported schedulers: local"):
        ProvisionClusterOperator(task_id="p", allocation_mode="fsdp:d1", scheduler="k8s").execute(make_context())
    with pytest.raises(ArealAirflowError, match="must be numbers"):
        ProvisionClusterOperator(task_id="p", allocation_mode="fsdp:d1", n_gpus="two").execute(make_context())


def test_split_checkpoint_url() -> None:
    assert split_checkpoint_url("s3://b/r/exp/t/checkpoints/step_40/") == ("s3://b/r/exp/t/checkpoints", 40)
    assert split_checkpoint_url("/runs/exp/t/checkpoints") == ("/runs/exp/t/checkpoints", None)
    assert split_checkpoint_url("/runs/step_x") == ("/runs/step_x", None)


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    """A checkpoints folder with a complete step_3 and an interrupted step_6 (no _COMPLETE marker)."""
    folder = tmp_path / "ckpt" / "exp" / "t0" / "checkpoints"
    for step in (3, 6):
        (folder / f"step_{step}").mkdir(parents=True)
        (folder / f"step_{step}" / "metadata.json").write_text("{}")
    (folder / "step_3" / "_COMPLETE").write_text("{}")
    return folder


def evaluate_op(tmp_path: Path, checkpoint: str, **kwargs) -> EvaluateCheckpointOperator:
    return EvaluateCheckpointOperator(
        task_id="e",
        config="configs/demo_grpo.yaml",
        checkpoint=checkpoint,
        overrides=[f"experiment.run_dir={tmp_path / 'run'}"],
        **kwargs,
    )


def test_evaluation_refuses_incomplete_missing_and_empty_checkpoints(tmp_path: Path, checkpoints: Path) -> None:
    with pytest.raises(ArealAirflowError, match=r"step_6 is incomplete .*complete ones in .*\['step_3'\]"):
        evaluate_op(tmp_path, (checkpoints / "step_6").as_uri()).execute(make_context())
    with pytest.raises(ArealAirflowError, match="step_9 does not exist"):
        evaluate_op(tmp_path, str(checkpoints / "step_9")).execute(make_context())
    with pytest.raises(ArealAirflowError, match="holds no complete checkpoint"):
        evaluate_op(tmp_path, str(tmp_path / "empty")).execute(make_context())
    with pytest.raises(ArealConfigError, match="checkpoint is empty"):
        evaluate_op(tmp_path, "None").execute(make_context())
    with pytest.raises(ArealConfigError, match="not valid"):
        EvaluateCheckpointOperator(
            task_id="e", config="configs/demo_grpo.yaml", checkpoint=str(checkpoints), overrides=["train.batch_size=-1"]
        ).execute(make_context())


def test_evaluation_locates_the_newest_complete_checkpoint(tmp_path: Path, checkpoints: Path) -> None:
    op = evaluate_op(tmp_path, str(checkpoints), n_prompts="5")
    url, step, layout = op._locate(op._config())
    assert (url, step) == ((checkpoints / "step_3").as_uri(), 3) and layout.is_complete(3)
    assert op._n_prompts(op._config()) == 5
    assert evaluate_op(tmp_path, str(checkpoints))._n_prompts(op._config()) is None  # every eval prompt, as the trainer
    with_limit = EvaluateCheckpointOperator(
        task_id="e",
        config="configs/demo_grpo.yaml",
        checkpoint=str(checkpoints),
        overrides=["evaluation.max_eval_prompts=7"],
    )
    assert with_limit._n_prompts(with_limit._config()) == 7
    with pytest.raises(ArealConfigError, match="n_prompts=0"):
        evaluate_op(tmp_path, str(checkpoints), n_prompts=0)._n_prompts(op._config())


def test_evaluation_record_logs_a_pointer_model(tmp_path: Path, store: SimpleNamespace) -> None:
    op = evaluate_op(tmp_path, "unused", mlflow_run_id=store.run_id, mlflow_tracking_uri=store.uri)
    uri = op._record("file:///c/step_3", 3, {"eval/reward": 0.5})
    assert (
        store.hook.get_conn().get_logged_model(uri.removeprefix("models:/")).params["checkpoint_url"]
        == "file:///c/step_3"
    )
    assert evaluate_op(tmp_path, "unused", mlflow_run_id="None")._record("file:///c/step_3", 3, {}) is None


def test_pick_best() -> None:
    evals = [
        None,
        {"step": 1, "metrics": {"eval/reward": 0.5}},
        {"step": 2, "metrics": {"eval/reward": 0.5}},
        {"step": 3, "metrics": {"eval/reward": 0.25}},
        {"step": 4, "metrics": {}},
    ]
    assert pick_best(evals, "eval/reward")["step"] == 2  # a tie goes to the later checkpoint
    assert pick_best(evals, "eval/reward", higher_is_better=False)["step"] == 3
    with pytest.raises(ArealAirflowError, match="no evaluation carries the gate metric 'eval/x'"):
        pick_best(evals, "eval/x")


class ProbingSequence(Sequence):
    """Like Airflow's lazy XCom sequence of a mapped task: an index past the end is a failed request
    (Airflow logs it as ``[error] XCom not found``); iterating probes one past the end to stop."""

    def __init__(self, items: list[Any]) -> None:
        self.items, self.probes = items, []

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if not isinstance(index, int):
            raise TypeError("only int indices")
        if not 0 <= index < len(self.items):
            self.probes.append(index)
            raise IndexError(index)
        return self.items[index]


def test_resolve_evaluations_never_reads_past_the_end() -> None:
    lazy = ProbingSequence([{"step": 1}, None, {"step": 3}])
    assert list(lazy) == [{"step": 1}, None, {"step": 3}] and lazy.probes == [3]  # what iteration does
    lazy.probes.clear()
    assert resolve_evaluations(lazy) == [{"step": 1}, None, {"step": 3}] and lazy.probes == []
    assert resolve_evaluations({"step": 2}) == [{"step": 2}]
    assert resolve_evaluations(e for e in [{"step": 4}]) == [{"step": 4}]
    for wrong in ("not a list", b"bytes", 3):
        with pytest.raises(ArealAirflowError, match="must be the evaluate task's XCom"):
            resolve_evaluations(wrong)


def test_register_model_operator(store: SimpleNamespace) -> None:
    def evaluation(step: int, reward: float) -> dict:
        url = f"file:///c/step_{step}"
        return {
            "checkpoint": url,
            "step": step,
            "model_dir": f"/hf/step_{step}",
            "metrics": {"eval/reward": reward},
            "model_uri": store.hook.log_checkpoint_model(store.run_id, url, {"eval/reward": reward}),
        }

    def register(evaluations) -> dict:
        return RegisterModelOperator(
            task_id="r",
            evaluations=evaluations,
            model_name="policy",
            mlflow_run_id=store.run_id,
            mlflow_tracking_uri=store.uri,
        ).execute(make_context())

    mapped = ProbingSequence([evaluation(3, 0.25), evaluation(6, 0.5)])  # the mapped evaluate task's XCom
    first = register(mapped)
    assert mapped.probes == []  # no lookup past the last evaluation: no "XCom not found" in the task log
    assert first["version"] == "1" and first["champion_changed"] and first["checkpoint"] == "file:///c/step_6"
    assert store.hook.get_champion("policy")["model_dir"] == "/hf/step_6"
    second = register(evaluation(9, 0.4))  # one unmapped evaluation, worse than the champion
    assert second["version"] == "2" and not second["champion_changed"] and second["aliases"] == ["candidate"]
    params = store.hook.get_conn().get_run(store.run_id).data.params
    assert params["registered_model"] == "policy" and params["registered_model_version"] == "1"  # write-once
    with pytest.raises(ArealAirflowError, match="has no MLflow model_uri"):
        register([{"checkpoint": "x", "metrics": {"eval/reward": 1.0}, "model_uri": None}])
    with pytest.raises(ArealAirflowError, match="must be the evaluate task's XCom"):
        register("not a list")


def test_a_checkpoint_of_a_cluster_job_is_evaluated_on_the_local_scheduler() -> None:
    """The evaluation's one server runs in the Airflow worker, which is no node of the job's Ray or
    SLURM cluster (their schedulers refuse to start there)."""
    from areal_tasks.config import load_config
    from operators.operators.evaluation import on_this_machine

    cfg = load_config("configs/demo_grpo.yaml", ["cluster.scheduler=ray", "cluster.nodes=2"])
    local = on_this_machine(cfg)
    assert (local.cluster.scheduler, local.cluster.nodes) == ("local", 1)
    assert (cfg.cluster.scheduler, cfg.cluster.nodes) == ("ray", 2)  # the job's config is left as it was
    assert local.experiment == cfg.experiment and local.rollout == cfg.rollout
