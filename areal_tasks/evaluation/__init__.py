"""Evaluation: turn sampled answers into benchmark metrics.

Torch-free. :mod:`areal_tasks.evaluation.metrics` scores per-item sample results (correctness and
extracted answers) into pass@1, unbiased pass@k, maj@k, answer rate and mean response length, plus
per-item records for JSONL. Answer extraction and comparison for math tasks live in
:mod:`areal_tasks.datasets.math_answers`.
"""

from areal_tasks.evaluation.metrics import EvalReport, ItemResult, SampleResult, compute_metrics, pass_at_k

__all__ = ["EvalReport", "ItemResult", "SampleResult", "compute_metrics", "pass_at_k"]
