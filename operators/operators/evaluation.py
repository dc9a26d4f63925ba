"""``EvaluateCheckpointOperator``: evaluate one checkpoint on its eval sets and record it in MLflow.

Mapped over the training task's checkpoints (``.partial(config=...).expand(checkpoint=...)``). For
one checkpoint URL (``.../checkpoints/step_<N>``, or a checkpoints folder: its newest complete one):

1. the checkpoint must be complete (``_COMPLETE`` marker), else a clear error;
2. it is exported once to an HF model directory (``<run_dir>/hf_exports/step_<N>_<hash of URL>``,
   reused on a retry) -- the inference server loads HF directories, not DCP shards;
3. the evaluation harness (:func:`areal_tasks.evaluation.harness.run_eval`) serves it with one
   inference server of the job's ``rollout.backend`` and scores the first ``n_prompts`` items of
   each eval set (``eval_sets``: URLs or ``NAME=URL``; none: the config's eval split) the way the
   trainer's own evaluation does (same workflow, reward, sampling and samples per prompt), so
   ``eval/reward`` of the final checkpoint on the eval split is the trainer's ``reward_after`` up to
   sampling noise; the summary and per-item records go to ``<run_dir>/evals/step_<N>.json`` and
   ``step_<N>.items.jsonl``;
4. with an MLflow run, every metric (:func:`eval_metrics`) is logged at ``step=<N>`` (so a run's
   checkpoints plot as curves) and a logged model is made that holds the checkpoint URL as a
   pointer (no weights; :meth:`~operators.hooks.mlflow.MlflowHook.log_checkpoint_model`).

XCom: ``{"checkpoint", "step", "model_dir", "model_uri" (None without an MLflow run), "metrics"
(:func:`eval_metrics`), "n_prompts" (items evaluated), "n_samples" (per prompt), "eval_sets",
"summary_file", "samples"}``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from operators.exceptions import ArealAirflowError, ArealConfigError

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = [
    "EvaluateCheckpointOperator",
    "eval_metrics",
    "metric_name",
    "on_this_machine",
    "parse_eval_sets",
    "split_checkpoint_url",
]

EXPORTS_DIR = "hf_exports"
#: where each checkpoint's summary JSON and item JSONL go, under the run directory.
EVALS_DIR = "evals"
#: sample completions kept in the XCom.
XCOM_SAMPLES = 2
#: summary keys that become MLflow metrics (plus ``pass@K`` and ``maj@K``, whose names hold K).
LOGGED_KEYS = ("pass@1", "answer_rate", "mean_response_length")


def metric_name(name: str) -> str:
    """The MLflow name of a metric: ``@`` (which MLflow refuses in names) becomes ``_at_``
    (``eval/pass@4`` -> ``eval/pass_at_4``), any other character MLflow refuses ``_``."""
    import re

    return re.sub(r"[^\w.\- :/]", "_", name.replace("@", "_at_"))


def eval_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The metrics of a harness summary, as logged to MLflow and offered to the registry gate.

    ``eval/reward`` (mean reward of all samples), ``eval/accuracy`` (share of correct samples: pass@1
    with the same samples per item), ``eval/answer_rate``, ``eval/pass_at_1``, ``eval/pass_at_K``,
    ``eval/maj_at_K``, ``eval/mean_response_length`` (:func:`metric_name` of the summary's keys);
    with several eval sets these are the pooled figures and each set adds the same metrics as
    ``eval/<set>/<metric>``.
    """

    def of(part: dict[str, Any], prefix: str) -> dict[str, float]:
        k = summary["k"]
        keys = (*LOGGED_KEYS, f"pass@{k}", f"maj@{k}")
        out = {f"{prefix}reward": float(part["mean_reward"]), f"{prefix}accuracy": float(part["pass@1"])}
        out.update({metric_name(f"{prefix}{key}"): float(part[key]) for key in keys if key in part})
        return out

    metrics = of(summary, "eval/")
    for name, part in (summary.get("sets") or {}).items():
        metrics.update(of(part, f"eval/{name}/"))
    return metrics


def parse_eval_sets(value: Any) -> list[str]:
    """``eval_sets`` as a list of set URLs: a list, a JSON list, or one comma-free URL; empty: none."""
    import json

    if value in (None, "", "None", "[]"):
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ArealConfigError(f"eval_sets={value!r} is not a JSON list of URLs: {exc}") from exc
        else:
            return [text]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ArealConfigError(f"eval_sets={value!r} must be a list of eval set URLs (or NAME=URL)")
    return [v.strip() for v in value]


def on_this_machine(cfg: Any) -> Any:
    """``cfg`` for an evaluation in this process: its one server runs here (the local scheduler, one
    node), whatever scheduler the training job ran on: a Ray or SLURM scheduler refuses to run
    outside its cluster, and the Airflow worker is not in it."""
    import dataclasses

    if cfg.cluster.scheduler == "local" and cfg.cluster.nodes == 1:
        return cfg
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, scheduler="local", nodes=1))


def split_checkpoint_url(url: str) -> tuple[str, int | None]:
    """``(checkpoints folder URL, step)`` of ``.../checkpoints/step_<N>``; ``(url, None)`` for a folder."""
    trimmed = str(url).rstrip("/")
    head, _, last = trimmed.rpartition("/")
    if last.startswith("step_") and last[5:].isdigit() and head:
        return head, int(last[5:])
    return trimmed, None


class EvaluateCheckpointOperator(BaseOperator):
    """Evaluate ``checkpoint`` with the job ``config`` (+ ``overrides``); see the module docstring.

    :param config: the training job's YAML (its dataset, rollout and evaluation settings are used).
    :param overrides: the training task's overrides (same run dir and storage options).
    :param mlflow_run_id: MLflow run to log into (none: nothing is logged, ``model_uri`` is None).
    :param n_prompts: eval prompts (default: ``evaluation.max_eval_prompts``, else all, as the trainer).
    :param export_dir: where the HF export goes (default: ``<run_dir>/hf_exports/<step>_<hash>``).
    :param eval_sets: eval set URLs (or ``NAME=URL``) to score; empty: the config's eval split.
    """

    template_fields = (
        "config",
        "overrides",
        "checkpoint",
        "mlflow_run_id",
        "mlflow_tracking_uri",
        "n_prompts",
        "export_dir",
        "eval_sets",
    )
    ui_color = "#f0d8d8"

    def __init__(
        self,
        *,
        config: str,
        checkpoint: str,
        overrides: list[str] | None = None,
        mlflow_run_id: str | None = None,
        mlflow_tracking_uri: str | None = None,
        n_prompts: int | str | None = None,
        export_dir: str | None = None,
        engine: str = "actor",
        eval_sets: list[str] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = config
        self.checkpoint = checkpoint
        self.overrides = list(overrides or [])
        self.mlflow_run_id = mlflow_run_id
        self.mlflow_tracking_uri = mlflow_tracking_uri
        self.n_prompts = n_prompts
        self.export_dir = export_dir
        self.engine = engine
        self.eval_sets = eval_sets

    def execute(self, context: Context) -> dict[str, Any]:
        from areal_tasks.errors import EvaluationError, RewardError
        from areal_tasks.evaluation import EvalOptions, run_eval, write_run
        from areal_tasks.evaluation.report import first_samples
        from areal_tasks.rollout.evaluation import samples_per_prompt

        cfg = self._config()
        eval_sets = parse_eval_sets(self.eval_sets)
        url, step, layout = self._locate(cfg)
        model_dir = self._export(cfg, url, step, layout)
        n_prompts = self._n_prompts(cfg)
        self.log.info(
            "evaluating %s (%s) on %s items of %s", url, model_dir, n_prompts or "all", eval_sets or "the eval split"
        )
        options = EvalOptions(n_samples=samples_per_prompt(cfg), max_items=n_prompts)
        try:
            run = run_eval(
                on_this_machine(cfg), str(model_dir), eval_sets, options, name=f"eval_step_{step}", progress=False
            )
        except (EvaluationError, RewardError) as exc:
            raise ArealConfigError(f"cannot evaluate {url}: {exc}") from exc
        summary_file = Path(cfg.experiment.run_dir) / EVALS_DIR / f"step_{step}.json"
        write_run(run, summary_file, summary_file.with_suffix(".items.jsonl"))
        metrics = eval_metrics(run.summary)
        model_uri = self._record(url, step, metrics)
        self.log.info("checkpoint step %d: %s", step, metrics)
        return {
            "checkpoint": url,
            "step": step,
            "model_dir": str(model_dir),
            "model_uri": model_uri,
            "metrics": metrics,
            "n_prompts": run.summary["n_items"],
            "n_samples": options.n_samples,
            "eval_sets": eval_sets,
            "summary_file": str(summary_file),
            "samples": first_samples(run, XCOM_SAMPLES),
        }

    # ------------------------------------------------------------------ steps

    def _config(self) -> Any:
        from areal_tasks.config import load_config
        from areal_tasks.errors import ConfigError
        from operators.operators.training import resolve_config_path

        path = resolve_config_path(self.config)
        try:
            return load_config(path, self.overrides)
        except ConfigError as exc:
            raise ArealConfigError(f"config {path} with overrides {self.overrides} is not valid: {exc}") from exc

    def _locate(self, cfg: Any) -> tuple[str, int, Any]:
        """The step URL, its step and the CheckpointLayout; ArealAirflowError if it is missing or incomplete."""
        from areal_tasks.checkpoint.layout import CheckpointLayout
        from storage import Storage, StorageError

        if not self.checkpoint or str(self.checkpoint) == "None":
            raise ArealConfigError(
                "checkpoint is empty: map this task over the training task's 'checkpoints' XCom "
                "or give a checkpoint URL (.../checkpoints/step_<N>)"
            )
        folder, step = split_checkpoint_url(str(self.checkpoint))
        try:
            layout = CheckpointLayout(Storage.from_url(folder, cfg.storage.options))
            if step is None:
                step = layout.latest()
                if step is None:
                    raise ArealAirflowError(f"{folder} holds no complete checkpoint; give a step_<N> URL of one")
            if not layout.is_complete(step):
                state = (
                    "is incomplete (no _COMPLETE marker: its save was interrupted)"
                    if layout.files(step)
                    else "does not exist"
                )
                complete = layout.complete_steps()
                raise ArealAirflowError(
                    f"checkpoint {layout.url(f'step_{step}')} {state}; complete ones in {folder}: "
                    f"{[f'step_{s}' for s in complete] or 'none'}"
                )
        except StorageError as exc:
            raise ArealAirflowError(f"cannot read checkpoint {self.checkpoint!r}: {exc}") from exc
        return layout.url(f"step_{step}"), step, layout

    def _export(self, cfg: Any, url: str, step: int, layout: Any) -> Path:
        """The HF directory of the checkpoint (exported now, or reused from an earlier try)."""
        from areal_tasks.checkpoint.export import export_hf
        from areal_tasks.errors import CheckpointError

        if self.export_dir:
            out = Path(self.export_dir).expanduser().absolute()
        else:
            digest = hashlib.sha1(url.encode("utf-8")).hexdigest()[:8]
            out = Path(cfg.experiment.run_dir) / EXPORTS_DIR / f"step_{step}_{digest}"
        if (out / "config.json").is_file():
            self.log.info("reusing the HF export %s", out)  # export_hf writes atomically: it is complete
            return out
        try:
            return Path(export_hf(layout.storage, step, out, engine=self.engine))
        except CheckpointError as exc:
            raise ArealAirflowError(f"cannot export {url} to an HF directory: {exc}") from exc

    def _n_prompts(self, cfg: Any) -> int | None:
        """The explicit ``n_prompts``, else ``evaluation.max_eval_prompts``; None = every eval prompt."""
        value = self.n_prompts if self.n_prompts not in (None, "", "None") else None
        try:
            n = int(value) if value is not None else cfg.evaluation.max_eval_prompts
        except ValueError as exc:
            raise ArealConfigError(f"n_prompts={value!r} must be an integer >= 1 (or empty: the config's)") from exc
        if n is not None and n < 1:
            raise ArealConfigError(f"n_prompts={n} must be >= 1")
        return n

    def _record(self, url: str, step: int, metrics: dict[str, float]) -> str | None:
        """Log ``metrics`` and a pointer model to the MLflow run; its ``models:/`` URI (None without a run)."""
        from operators.hooks.mlflow import MlflowHook

        run_id = None if self.mlflow_run_id in (None, "", "None") else str(self.mlflow_run_id)
        if run_id is None:
            self.log.warning("no mlflow_run_id: the evaluation of %s is not recorded in MLflow", url)
            return None
        return MlflowHook(self.mlflow_tracking_uri).log_checkpoint_model(run_id, url, metrics, step=step)
