"""What a run report reads from a run directory, loaded once into :class:`RunData`.

Every input but one is optional, so a partial run (a job still going, or killed after a few steps)
still gets a report: ``rl_metrics.jsonl`` (per-step curves), ``summary.json``, ``config.yaml`` (the
config name), ``evals/step_N.json``, ``sessions.jsonl`` (the session tracer's per-episode records)
and ``trace.json`` (the perf tracer's Chrome trace; only its presence matters here). A directory
holding none of the run files is not a run dir: :class:`~areal_tasks.errors.ReportError`.

A JSON-lines file written by a live job may end in a half-written line; such lines are skipped
and counted (:attr:`RunData.skipped_lines`) so the report can say so.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal_tasks.api.run_dir import RESOLVED_CONFIG, RL_METRICS, SESSIONS, SFT_METRICS, SUMMARY
from areal_tasks.errors import ReportError
from areal_tasks.trace.merge import TRACE_FILE

logger = logging.getLogger(__name__)

#: the session tracer's per-episode records (one JSON object a line); the perf tracer's Chrome
#: trace-event JSON is ``TRACE_FILE`` (opened in Perfetto).
SESSIONS_FILE = SESSIONS
#: the report's default name inside the run dir.
REPORT_FILE = "report.html"
EVALS_DIR = "evals"
#: files any of which makes a directory a run dir.
RUN_FILES = (RL_METRICS, SUMMARY, RESOLVED_CONFIG, SFT_METRICS)


@dataclass
class RunData:
    """One run directory's report inputs (absent files are empty lists / dicts / None)."""

    run_dir: Path
    rl_metrics: list[dict[str, Any]] = field(default_factory=list)
    sft_metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    config_name: str | None = None
    evals: list[dict[str, Any]] = field(default_factory=list)
    #: None when ``sessions.jsonl`` is absent (an empty file gives an empty list).
    sessions: list[dict[str, Any]] | None = None
    trace_path: Path | None = None
    skipped_lines: dict[str, int] = field(default_factory=dict)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one per-step RL metric, steps without a finite value left out."""
        steps, values = [], []
        for row in self.rl_metrics:
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
                steps.append(int(row.get("step", len(steps) + 1)))
                values.append(float(value))
        return steps, values


def load_run(run_dir: str | Path) -> RunData:
    """Read ``run_dir``; ReportError when it is not a directory or holds none of :data:`RUN_FILES`."""
    root = Path(run_dir).expanduser()
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory; give a run dir (the job's experiment.run_dir)")
    if not any((root / name).is_file() for name in RUN_FILES):
        raise ReportError(
            f"{root} is not a run dir: it holds none of {', '.join(RUN_FILES)} "
            "(a run dir is the job's experiment.run_dir, e.g. runs/latest)"
        )
    data = RunData(run_dir=root.resolve())
    data.rl_metrics = _read_jsonl(root / RL_METRICS, data.skipped_lines)
    data.sft_metrics = _read_jsonl(root / SFT_METRICS, data.skipped_lines)
    data.summary = _read_json(root / SUMMARY)
    data.config_name = _config_name(root / RESOLVED_CONFIG)
    data.evals = _read_evals(root / EVALS_DIR)
    if (root / SESSIONS_FILE).is_file():
        data.sessions = _read_jsonl(root / SESSIONS_FILE, data.skipped_lines)
    if (root / TRACE_FILE).is_file():
        data.trace_path = (root / TRACE_FILE).resolve()
    return data


def _read_jsonl(path: Path, skipped: dict[str, int]) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skipped[path.name] = skipped.get(path.name, 0) + 1
                continue
            if isinstance(row, dict):
                rows.append(row)
    if skipped.get(path.name):
        logger.warning("%s: skipped %d line(s) that are not JSON (a job still writing?)", path, skipped[path.name])
    return rows


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        logger.warning("%s is not JSON (%s): the report goes without it", path, exc)
        return {}
    return value if isinstance(value, dict) else {}


def _config_name(path: Path) -> str | None:
    """``experiment.name`` (and trial) of the resolved config, read without a YAML parser."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    block = re.search(r"^experiment:\n((?:[ \t]+.*\n?)*)", text, re.MULTILINE)
    if not block:
        return None
    found = dict(re.findall(r"^[ \t]+(name|trial):[ \t]*(\S+)", block.group(1), re.MULTILINE))
    if "name" not in found:
        return None
    return f"{found['name']} / {found['trial']}" if "trial" in found else found["name"]


def _read_evals(folder: Path) -> list[dict[str, Any]]:
    """``evals/step_N.json`` objects with their ``step``, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.glob("step_*.json"):
        digits = path.stem.rsplit("_", 1)[-1]
        if digits.isdigit():
            found.append({"step": int(digits), **_read_json(path)})
    return sorted(found, key=lambda item: item["step"])
