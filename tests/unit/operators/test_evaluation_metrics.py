"""The checkpoint-evaluation operator logs every harness metric per checkpoint to MLflow (at the
checkpoint's step, so a run's checkpoints plot as curves), passes its eval sets to the harness, and
the registry gates on any of those metrics (a metric no evaluation logged fails listing the ones
there are). The harness itself is replaced by a stand-in with known figures (tests/unit/evaluation
drives the real one)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from operators.exceptions import ArealAirflowError
from operators.operators import EvaluateCheckpointOperator, RegisterModelOperator
from operators.operators.evaluation import eval_metrics, metric_name, parse_eval_sets
from tests.unit.operators.conftest import make_context

#: per checkpoint step: (pass@1, pass@4, maj@4); step 6 is better on pass@1, step 3 on maj@4
FIGURES = {3: (0.25, 0.5, 0.75), 6: (0.5, 0.75, 0.25)}
#: what the harness names the sets ``gsm=/d/gsm.jsonl`` and ``demo:arithmetic?n_eval=4``
SET_NAMES = ("gsm", "arithmetic")


def _summary(step: int, sets: list[str]) -> dict[str, Any]:
    p1, p4, m4 = FIGURES[step]
    figures = {"pass@1": p1, "pass@4": p4, "maj@4": m4, "answer_rate": 1.0, "mean_response_length": 5.0}
    summary = {**figures, "n_items": 2, "n_samples": 8, "mean_reward": p1, "k": 4, "samples_per_item": 4}
    if len(sets) > 1:
        summary["sets"] = {name: {**figures, "mean_reward": p1} for name in SET_NAMES}
    return summary


@pytest.fixture
def fake_harness(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replaces ``run_eval``; returns the calls it got."""
    import areal_tasks.evaluation as evaluation
    from areal_tasks.evaluation import EvalRun

    calls: list[dict[str, Any]] = []

    def run_eval(cfg, model_dir, data, options, *, name, progress):  # type: ignore[no-untyped-def]
        step = int(name.rsplit("_", 1)[1])
        calls.append({"model_dir": model_dir, "data": list(data), "options": options, "step": step})
        item = {"item_id": "a/0", "prompt": "p", "reference": "1", "completions": ["Answer: 1"], "rewards": [1.0]}
        return EvalRun(_summary(step, list(data)), [item])

    monkeypatch.setattr(evaluation, "run_eval", run_eval)
    return calls


def _checkpoints(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt" / "checkpoints"
    for step in FIGURES:
        (folder / f"step_{step}").mkdir(parents=True)
        (folder / f"step_{step}" / "metadata.json").write_text("{}")
        (folder / f"step_{step}" / "_COMPLETE").write_text("{}")
    return folder


def test_every_metric_is_logged_per_checkpoint_and_gates_the_registry(
    tmp_path: Path, store: SimpleNamespace, fake_harness: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EvaluateCheckpointOperator, "_export", lambda self, cfg, url, step, layout: tmp_path / "hf")
    folder = _checkpoints(tmp_path)
    sets = ["gsm=/d/gsm.jsonl", "demo:arithmetic?n_eval=4"]
    results = [
        EvaluateCheckpointOperator(
            task_id="e",
            config="configs/demo_grpo.yaml",
            checkpoint=str(folder / f"step_{step}"),
            overrides=[f"experiment.run_dir={tmp_path / 'run'}"],
            mlflow_run_id=store.run_id,
            mlflow_tracking_uri=store.uri,
            eval_sets=sets,
        ).execute(make_context())
        for step in FIGURES
    ]
    assert [c["data"] for c in fake_harness] == [sets, sets]
    assert fake_harness[0]["options"].n_samples == 4  # the trainer's: evaluation.n_samples when sampling
    metrics = results[0]["metrics"]
    assert metrics["eval/reward"] == 0.25 and metrics["eval/accuracy"] == 0.25  # what the gates read today
    assert {"eval/pass_at_1", "eval/pass_at_4", "eval/maj_at_4", "eval/answer_rate", "eval/gsm/maj_at_4"} <= set(
        metrics
    )
    assert Path(results[0]["summary_file"]).is_file()

    client = store.client
    for name in ("eval/pass_at_1", "eval/pass_at_4", "eval/maj_at_4", "eval/reward", "eval/gsm/pass_at_1"):
        history = sorted((m.step, m.value) for m in client.get_metric_history(store.run_id, name))
        assert [s for s, _ in history] == [3, 6], name  # one point per checkpoint, at its step
    assert [
        v for _, v in sorted((m.step, m.value) for m in client.get_metric_history(store.run_id, "eval/maj_at_4"))
    ] == [
        0.75,
        0.25,
    ]

    def register(gate: str) -> dict[str, Any]:
        return RegisterModelOperator(
            task_id="r",
            evaluations=results,
            model_name=f"policy-{gate.replace('/', '-').replace('@', '-')}",
            gate_metric=gate,
            mlflow_run_id=store.run_id,
            mlflow_tracking_uri=store.uri,
        ).execute(make_context())

    assert register("eval/maj_at_4")["checkpoint"].endswith("step_3")  # a non-default gate picks its best
    assert register("eval/pass@1")["checkpoint"].endswith("step_6")  # the summary's own name works too
    with pytest.raises(ArealAirflowError, match=r"gate metric 'eval/pass_at_8'.*'eval/maj_at_4'.*set gate_metric"):
        register("eval/pass@8")


def test_eval_metrics_and_eval_sets_args() -> None:
    assert metric_name("eval/my set+1/maj@4") == "eval/my set_1/maj_at_4"
    one = eval_metrics(_summary(3, ["x"]))
    assert one == {
        "eval/reward": 0.25,
        "eval/accuracy": 0.25,
        "eval/pass_at_1": 0.25,
        "eval/pass_at_4": 0.5,
        "eval/maj_at_4": 0.75,
        "eval/answer_rate": 1.0,
        "eval/mean_response_length": 5.0,
    }
    assert parse_eval_sets(None) == [] and parse_eval_sets("[]") == [] and parse_eval_sets("") == []
    assert parse_eval_sets('["a.jsonl", "b=c.jsonl"]') == ["a.jsonl", "b=c.jsonl"]
    assert parse_eval_sets("/d/x.jsonl") == ["/d/x.jsonl"]
    with pytest.raises(Exception, match="list of eval set URLs"):
        parse_eval_sets([1])
