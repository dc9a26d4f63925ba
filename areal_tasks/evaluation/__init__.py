"""Evaluation: sample a model on eval sets and turn the answers into benchmark metrics.

Torch-free at import. :mod:`areal_tasks.evaluation.metrics` scores per-item sample results
(correctness and extracted answers) into pass@1, unbiased pass@k, maj@k, answer rate and mean
response length, plus per-item records for JSONL. :mod:`areal_tasks.evaluation.harness` runs a
model on eval sets through one inference server (``areal eval``, the checkpoint-evaluation
operator), with :mod:`~areal_tasks.evaluation.sets` (loading and naming sets),
:mod:`~areal_tasks.evaluation.extractors` (the answer a completion gives, by reward) and
:mod:`~areal_tasks.evaluation.report` (the JSON summary and JSONL records). Answer extraction and
comparison for math tasks live in :mod:`areal_tasks.datasets.math_answers`; see docs/evaluation.md.
"""

from areal_tasks.evaluation.harness import EvalOptions, run_eval, sample_and_score
from areal_tasks.evaluation.metrics import EvalReport, ItemResult, SampleResult, compute_metrics, pass_at_k
from areal_tasks.evaluation.report import EvalRun, write_run

__all__ = [
    "EvalOptions",
    "EvalReport",
    "EvalRun",
    "ItemResult",
    "SampleResult",
    "compute_metrics",
    "pass_at_k",
    "run_eval",
    "sample_and_score",
    "write_run",
]
