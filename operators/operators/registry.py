"""``RegisterModelOperator``: the best evaluated checkpoint becomes a registry version.

It takes the XCom of the mapped evaluations, picks the one with the best gate metric (ties: the
later checkpoint), and registers its logged pointer model under ``model_name`` with the alias
``candidate``; ``champion`` moves to it only when it beats the current champion on the gate metric
(:meth:`~operators.hooks.mlflow.MlflowHook.register`). The version is tagged with the checkpoint
URL, its metrics and the HF export it was evaluated from (``areal.model_dir``), and the MLflow run
gets the params ``registered_model`` and ``registered_model_version``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from operators.exceptions import ArealAirflowError

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["RegisterModelOperator", "pick_best", "resolve_evaluations"]


def pick_best(
    evaluations: Iterable[dict[str, Any] | None], gate_metric: str, higher_is_better: bool = True
) -> dict[str, Any]:
    """The evaluation with the best ``gate_metric`` (ties: the later step); ArealAirflowError when none has it."""
    scored = [e for e in evaluations if e and isinstance(e.get("metrics"), dict)]
    usable = [e for e in scored if gate_metric in e["metrics"]]
    if not usable:
        available = sorted({name for e in scored for name in e["metrics"]})
        raise ArealAirflowError(
            f"no evaluation carries the gate metric {gate_metric!r}; the evaluations logged "
            f"{available or 'no metrics'}: set gate_metric to one of them (docs/evaluation.md lists what each means)"
        )
    sign = 1.0 if higher_is_better else -1.0
    return max(usable, key=lambda e: (sign * float(e["metrics"][gate_metric]), e.get("step") or 0))


def resolve_evaluations(evaluations: Any) -> list[Any]:
    """The evaluate task's XCom as a list: one dict (unmapped), or a sequence/iterable of them (mapped).

    A mapped task's XCom arrives as Airflow's lazy XCom sequence. Iterating it (``list(seq)``, a
    ``for`` loop) fetches items by offset until one is missing, and that last probe makes Airflow log
    an alarming (harmless) ``[error] XCom not found ... offset=<n>``. Indexing within ``len(seq)``
    (one count request, then one request per item) never asks past the end.
    """
    if isinstance(evaluations, Mapping):  # a single (unmapped) evaluation
        return [evaluations]
    if isinstance(evaluations, Sequence) and not isinstance(evaluations, (str, bytes)):
        return [evaluations[i] for i in range(len(evaluations))]
    if isinstance(evaluations, Iterable) and not isinstance(evaluations, (str, bytes)):
        return list(evaluations)
    raise ArealAirflowError(
        f"evaluations must be the evaluate task's XCom (a list of dicts), got "
        f"{type(evaluations).__name__}: {str(evaluations)[:200]!r}"
    )


class RegisterModelOperator(BaseOperator):
    """Register the best of ``evaluations`` as a version of ``model_name`` (see the module docstring).

    XCom: ``{"name", "version", "aliases", "champion_changed", "previous_champion", "gate_metric",
    "gate_value", "champion_value", "checkpoint", "model_uri", "model_dir", "metrics"}``.
    """

    template_fields = ("evaluations", "model_name", "gate_metric", "mlflow_run_id", "mlflow_tracking_uri")
    ui_color = "#d0e8e8"

    def __init__(
        self,
        *,
        evaluations: Any,
        model_name: str,
        gate_metric: str = "eval/reward",
        higher_is_better: bool = True,
        mlflow_run_id: str | None = None,
        mlflow_tracking_uri: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.evaluations = evaluations
        self.model_name = model_name
        self.gate_metric = gate_metric
        self.higher_is_better = higher_is_better
        self.mlflow_run_id = mlflow_run_id
        self.mlflow_tracking_uri = mlflow_tracking_uri

    def execute(self, context: Context) -> dict[str, Any]:
        from operators.hooks.mlflow import MlflowHook
        from operators.operators.evaluation import metric_name

        gate_metric = metric_name(str(self.gate_metric))  # eval/pass@4 names the logged eval/pass_at_4
        best = pick_best(resolve_evaluations(self.evaluations), gate_metric, self.higher_is_better)
        if not best.get("model_uri"):
            raise ArealAirflowError(
                f"the best evaluation ({best.get('checkpoint')}) has no MLflow model_uri: give the evaluate task "
                "an mlflow_run_id so that it logs a pointer model"
            )
        hook = MlflowHook(self.mlflow_tracking_uri)
        tags = {
            k: str(v)
            for k, v in (("areal.model_dir", best.get("model_dir")), ("areal.checkpoint_step", best.get("step")))
            if v is not None
        }
        result = hook.register(
            best["model_uri"], self.model_name, best["metrics"], gate_metric, self.higher_is_better, tags=tags
        )
        run_id = None if self.mlflow_run_id in (None, "", "None") else str(self.mlflow_run_id)
        if run_id:
            hook.log_params(
                run_id, {"registered_model": self.model_name, "registered_model_version": result["version"]}
            )
        self.log.info(
            "registered %s as %s v%s (aliases %s)",
            best.get("checkpoint"),
            self.model_name,
            result["version"],
            result["aliases"],
        )
        return {
            **result,
            "checkpoint": best.get("checkpoint"),
            "model_uri": best["model_uri"],
            "model_dir": best.get("model_dir"),
            "metrics": best["metrics"],
        }
