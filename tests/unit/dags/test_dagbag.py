"""The DAG files parse cleanly, fast and without torch, and their Params make a usable trigger form.

The DagBag is built in a fresh interpreter (a throwaway ``AIRFLOW_HOME``) so that what the parse
imports can be checked: Airflow's DAG processor parses these files every few seconds, and a DAG file
that pulls in torch or transformers makes every parse cost seconds. The parse time is printed
(``pytest -s``), never asserted: machines are noisy.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
DAGS = ROOT / "dags"
DAG_IDS = {"areal_rl_training", "areal_scheduled_retraining", "areal_checkpoint_evaluation"}
HEAVY = ("torch", "transformers", "peft", "mlflow")

PARSE_SCRIPT = textwrap.dedent(
    f"""
    import json, sys, time
    started = time.perf_counter()
    from airflow.dag_processing.dagbag import BundleDagBag
    imported = time.perf_counter()
    bag = BundleDagBag(dag_folder=sys.argv[1], bundle_path=sys.argv[1], bundle_name="dags-folder")
    parsed = time.perf_counter()

    def seconds(value):
        return None if value is None else value.total_seconds()

    dags = {{}}
    for dag_id, dag in bag.dags.items():
        dags[dag_id] = {{
            "fileloc": dag.fileloc,
            "params": {{name: {{"value": param.value if param.has_value else None,
                              "description": param.description, "schema": param.schema}}
                       for name, param in dag.params.items()}},
            "has_failure_callback": bool(dag.has_on_failure_callback),
            "watchers": [[w.name, *w.trigger.serialize()] for w in
                         getattr(getattr(dag.timetable, "asset_condition", None), "watchers", None) or []],
            "tasks": {{t.task_id: {{"retries": t.retries,
                                  "retry_exponential_backoff": t.retry_exponential_backoff,
                                  "retry_delay_s": seconds(t.retry_delay),
                                  "execution_timeout_s": seconds(t.execution_timeout),
                                  "on_failure_callback": bool(t.on_failure_callback),
                                  "on_retry_callback": bool(t.on_retry_callback),
                                  "upstream": sorted(t.upstream_task_ids)}} for t in dag.tasks}},
        }}
    print(json.dumps({{
        "import_errors": {{k: str(v) for k, v in bag.import_errors.items()}},
        "dags": dags,
        "airflow_import_s": imported - started,
        "parse_s": parsed - imported,
        "heavy": sorted(m for m in {HEAVY!r} if m in sys.modules),
    }}))
    """
)


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AREAL_DAG_RETRIES": "3",
        "AREAL_DAG_RETRY_DELAY_S": "7",
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", PARSE_SCRIPT, str(DAGS)], cwd=home, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"parsing dags/ crashed:\n{out.stderr[-4000:]}"
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"\nparse time of dags/: {result['parse_s'] * 1000:.0f} ms for {len(result['dags'])} DAGs "
        f"(importing Airflow first: {result['airflow_import_s']:.2f} s)"
    )
    return result


def test_dagbag_imports_without_errors(parsed: dict[str, Any]) -> None:
    assert parsed["import_errors"] == {}


def test_all_three_dags_are_present(parsed: dict[str, Any]) -> None:
    assert set(parsed["dags"]) == DAG_IDS
    for dag_id, dag in parsed["dags"].items():
        assert Path(dag["fileloc"]).name == f"{dag_id}.py"


def test_parsing_imports_no_torch_or_transformers(parsed: dict[str, Any]) -> None:
    assert parsed["heavy"] == [], f"parsing dags/ imported {parsed['heavy']}; import them inside execute()/tasks"


def test_every_param_is_a_documented_typed_form_field(parsed: dict[str, Any]) -> None:
    problems = []
    for dag_id, dag in parsed["dags"].items():
        for name, param in dag["params"].items():
            schema = param["schema"]
            where = f"{dag_id}.params.{name}"
            if not schema.get("title"):
                problems.append(f"{where}: no title")
            if not (param["description"] or schema.get("description")):
                problems.append(f"{where}: no description")
            if not schema.get("type"):
                problems.append(f"{where}: no type")
            if not schema.get("section"):
                problems.append(f"{where}: no form section")
            types = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
            if "integer" in types and ("minimum" not in schema or "maximum" not in schema):
                problems.append(f"{where}: an integer without minimum/maximum")
            if (
                "string" in types
                and not any(k in schema for k in ("enum", "minLength", "maxLength", "pattern"))
                and "null" not in types
            ):
                problems.append(f"{where}: a required string without limits (enum/minLength/pattern)")
    assert not problems, "\n".join(problems)


def test_param_defaults_validate_against_their_schemas(parsed: dict[str, Any]) -> None:
    from jsonschema import Draft7Validator

    for dag_id, dag in parsed["dags"].items():
        for name, param in dag["params"].items():
            Draft7Validator.check_schema(param["schema"])
            if dag_id == "areal_checkpoint_evaluation" and name == "checkpoint_url":
                assert param["value"] is None, "checkpoint_url must be required (no default)"
                continue
            errors = list(Draft7Validator(param["schema"]).iter_errors(param["value"]))
            assert not errors, f"{dag_id}.params.{name} default {param['value']!r}: {errors[0].message}"


def test_training_dags_expose_the_job_params(parsed: dict[str, Any]) -> None:
    wanted = {
        "config",
        "model",
        "dataset",
        "algorithm",
        "allocation_mode",
        "storage_url",
        "experiment_name",
        "max_steps",
        "sft_steps",
        "eval_prompts",
        "mlflow_tracking_uri",
        "registered_model_name",
    }
    for dag_id in ("areal_rl_training", "areal_scheduled_retraining"):
        assert wanted <= set(parsed["dags"][dag_id]["params"]), dag_id
    params = parsed["dags"]["areal_rl_training"]["params"]
    assert params["config"]["value"] == "configs/demo_grpo.yaml"
    assert "grpo" in params["algorithm"]["schema"]["enum"] and "ppo" in params["algorithm"]["schema"]["enum"]
    assert params["max_steps"]["schema"]["minimum"] == 1


def test_param_choices_are_the_registries(parsed: dict[str, Any]) -> None:
    """The algorithm and scheduler choices are derived from the registries, never listed by hand."""
    from areal_tasks.config.algorithm import AlgorithmConfig
    from areal_tasks.launch.registry import scheduler_kinds

    for dag_id in ("areal_rl_training", "areal_scheduled_retraining"):
        params = parsed["dags"][dag_id]["params"]
        assert params["algorithm"]["schema"]["enum"] == [None, *AlgorithmConfig.names()]
        assert params["scheduler"]["schema"]["enum"] == list(scheduler_kinds())
        assert {"local", "ray", "slurm"} <= set(scheduler_kinds())


def test_tasks_retry_with_backoff_time_out_and_report_failures(parsed: dict[str, Any]) -> None:
    for dag_id, dag in parsed["dags"].items():
        assert dag["has_failure_callback"], dag_id
        for task_id, t in dag["tasks"].items():
            where = f"{dag_id}.{task_id}"
            assert t["execution_timeout_s"], f"{where}: no execution timeout"
            assert t["on_failure_callback"] and t["on_retry_callback"], f"{where}: no failure/retry callback"
            if task_id == "resolve_job":
                assert t["retries"] == 0, "a bad config does not heal: resolve_job must not retry"
                continue
            if task_id == "pipeline_failed":
                assert t["retries"] == 0, "pipeline_failed always raises: retrying it only delays the failed state"
                continue
            assert t["retries"] == 3 and t["retry_delay_s"] == 7, f"{where}: AREAL_DAG_RETRIES/_DELAY_S not applied"
            assert t["retry_exponential_backoff"] > 1, f"{where}: no exponential backoff"
    train = parsed["dags"]["areal_rl_training"]["tasks"]["train"]
    assert train["execution_timeout_s"] >= 24 * 3600


def test_a_failed_task_fails_the_run(parsed: dict[str, Any]) -> None:
    """The clean-up task runs (and succeeds) only when something failed; were it the only leaf, a
    failed pipeline would end as a successful run. ``pipeline_failed`` is a leaf downstream of every
    task that may fail first, with the ONE_FAILED rule, so a failure always fails the run."""
    for dag_id, dag in parsed["dags"].items():
        tasks = dag["tasks"]
        assert "pipeline_failed" in tasks, f"{dag_id}: no pipeline_failed leaf"
        watched = set(tasks["pipeline_failed"]["upstream"])
        for must in ("resolve_job", "start_mlflow_run", "evaluate_checkpoint", "register_model"):
            assert must in watched, f"{dag_id}: pipeline_failed does not watch {must}"
        downstream_of = {u for t in tasks.values() for u in t["upstream"]}
        assert "pipeline_failed" not in downstream_of, f"{dag_id}: pipeline_failed must be a leaf"


def test_training_graph_order(parsed: dict[str, Any]) -> None:
    tasks = parsed["dags"]["areal_rl_training"]["tasks"]
    chain = ["resolve_job", "validate_storage", "detect_model", "provision_cluster", "start_mlflow_run", "train"]
    for before, after in itertools.pairwise(chain):
        assert before in tasks[after]["upstream"], f"{after} must run after {before}"
    assert "train" in tasks["checkpoints_to_evaluate"]["upstream"]
    assert "evaluate_checkpoint" in tasks["register_model"]["upstream"]
    assert "register_model" in tasks["finish_pipeline"]["upstream"]
    assert "start_from_champion" in parsed["dags"]["areal_scheduled_retraining"]["tasks"]["resolve_job"]["upstream"]


def test_the_training_data_asset_is_watched_for_new_files(parsed: dict[str, Any]) -> None:
    """A new data file under ``$AREAL_TRAINING_DATA_URI`` emits the Asset's event: the retraining
    DAG's Asset carries the installed package's event trigger (never one defined in the DAG file)."""
    watchers = parsed["dags"]["areal_scheduled_retraining"]["watchers"]
    assert watchers == [
        [
            "areal_training_data_files",
            "operators.triggers.new_files.NewDataFileTrigger",
            {"url": "file:///opt/areal/data/train", "pattern": "*.jsonl", "poll_interval": 60.0, "options": {}},
        ]
    ]
    assert parsed["dags"]["areal_rl_training"]["watchers"] == []
