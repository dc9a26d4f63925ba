"""The harness's output: one JSON summary per run and one JSONL record per item.

The summary holds the metrics of :func:`~areal_tasks.evaluation.metrics.compute_metrics` under their
own keys (``pass@1``, ``pass@K``, ``maj@K``, ``answer_rate``, ``mean_response_length``, ``n_items``,
``n_samples`` -- all samples drawn), then ``mean_reward`` (mean reward over all samples),
``length_unit`` and the run's facts (``model``, ``data``, ``reward``, ``extractor``, ``temperature``,
``k``, ``samples_per_item``, ``backend``, ``wall_s``). With one eval set the metrics are that set's;
with several, the top-level metrics are the **pooled** ones (every item of every set counted once,
as if the sets were one; a larger set weighs more) and ``sets`` maps each set's name to its own
metrics and ``data``. Per-item records (:func:`item_records`) add the set, prompt, completions and
rewards to the metric records, one JSON object per line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.evaluation.extractors import extractor_for
from areal_tasks.evaluation.metrics import EvalReport, ItemResult, compute_metrics

if TYPE_CHECKING:
    from areal_tasks.evaluation.harness import EvalOptions
    from areal_tasks.evaluation.sets import EvalSet

logger = logging.getLogger(__name__)

__all__ = ["EvalRun", "SetOutcome", "build_run", "items_path_for", "write_run"]


@dataclass(frozen=True)
class SetOutcome:
    """One set's scored items and each sample's reward (``rewards[i][j]``: item i, sample j)."""

    eval_set: EvalSet
    items: list[ItemResult]
    rewards: list[list[float]]


@dataclass
class EvalRun:
    """The JSON ``summary`` of a run and its per-item ``items`` records (JSONL lines)."""

    summary: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)


def _metrics(report: EvalReport, rewards: Sequence[float]) -> dict[str, Any]:
    return {
        **report.summary,
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "length_unit": report.length_unit,
    }


def item_records(outcome: SetOutcome, report: EvalReport) -> list[dict[str, Any]]:
    """``report``'s per-item records with the set name, prompt, completions and rewards added."""
    records = []
    for record, item, rewards, eval_item in zip(
        report.items, outcome.items, outcome.rewards, outcome.eval_set.records, strict=True
    ):
        records.append(
            {
                "set": outcome.eval_set.name,
                **record,
                "prompt": eval_item.prompt,
                "completions": [s.text for s in item.samples],
                "rewards": rewards,
                "n_tokens": [s.n_tokens for s in item.samples],
            }
        )
    return records


def build_run(outcomes: Sequence[SetOutcome], options: EvalOptions, facts: dict[str, Any]) -> EvalRun:
    """The summary and item records of ``outcomes`` scored at ``options.k`` (see the module docstring)."""
    assert options.k is not None and options.reward is not None, "resolve the options first"
    extractor = extractor_for(options.reward)
    per_set, items = {}, []
    for outcome in outcomes:
        report = compute_metrics(outcome.items, options.k, vote_key=extractor.vote_key)
        rewards = [r for item in outcome.rewards for r in item]
        per_set[outcome.eval_set.name] = {**_metrics(report, rewards), "data": outcome.eval_set.source}
        items.extend(item_records(outcome, report))
    run_facts = {
        **facts,
        "reward": options.reward,
        "extractor": extractor.name,
        "temperature": options.temperature,
        "k": options.k,
        "samples_per_item": options.n_samples,
    }
    if len(outcomes) == 1:
        only = next(iter(per_set.values()))
        return EvalRun({**only, **run_facts}, items)
    pooled = compute_metrics([i for o in outcomes for i in o.items], options.k, vote_key=extractor.vote_key)
    all_rewards = [r for o in outcomes for item in o.rewards for r in item]
    summary = {
        **_metrics(pooled, all_rewards),
        "data": [o.eval_set.source for o in outcomes],
        **run_facts,
        "sets": per_set,
    }
    return EvalRun(summary, items)


def first_samples(run: EvalRun, n: int) -> list[dict[str, Any]]:
    """The first sample of each of the first ``n`` items: ``prompt``, ``answer``, ``completion``, ``reward``
    (the few completions a result shows a reader)."""
    return [
        {
            "prompt": item["prompt"],
            "answer": item["reference"],
            "completion": item["completions"][0],
            "reward": item["rewards"][0],
        }
        for item in run.items[:n]
    ]


def items_path_for(out: Path) -> Path:
    """Where the per-item JSONL of ``--out FILE`` goes: ``res.json`` -> ``res.items.jsonl``."""
    if out.suffix == ".json":
        return out.with_suffix(".items.jsonl")
    return out.with_name(out.name + ".items.jsonl")


def write_run(run: EvalRun, out: Path | None, items_path: Path | None) -> None:
    """The summary to ``out`` (indented JSON) and the item records to ``items_path`` (JSONL); None skips one."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(run.summary, indent=2) + "\n", encoding="utf-8")
        logger.info("summary written to %s", out)
    if items_path is not None:
        items_path.parent.mkdir(parents=True, exist_ok=True)
        with items_path.open("w", encoding="utf-8") as handle:
            for record in run.items:
                handle.write(json.dumps(record) + "\n")
        logger.info("%d item records written to %s", len(run.items), items_path)
