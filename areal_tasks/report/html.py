"""The run report as one self-contained HTML file: summary, figures, episode table, trace pointer.

Everything the page needs is inside it: plotly.js is inlined (no CDN), the figures and the episode
rows are embedded JSON, the CSS and the script are inline (:mod:`areal_tasks.report.assets`), so it
opens offline, from an MLflow artifact view or a mail attachment alike. The only outside link is
to the Perfetto UI, for ``trace.json``.
"""

from __future__ import annotations

import html
import json
import logging
from pathlib import Path
from typing import Any

from areal_tasks.errors import ReportError
from areal_tasks.report.assets import CSS, JS
from areal_tasks.report.data import REPORT_FILE, SESSIONS_FILE, TRACE_FILE, RunData, load_run
from areal_tasks.report.episodes import COLUMNS, episode_rows
from areal_tasks.report.figures import Panel, build_panels

logger = logging.getLogger(__name__)

PERFETTO_UI = "https://ui.perfetto.dev"


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element: every ``<`` escaped, so no ``</script>`` or ``<!--`` in
    the data (an episode id, a reason) can end or derail it."""
    return json.dumps(value, separators=(",", ":"), default=str).replace("<", "\\u003c")


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "n/a" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def summary_rows(data: RunData) -> list[tuple[str, str]]:
    """(label, value) lines of the summary table; from summary.json, else from the metrics."""
    s = data.summary
    _, rewards = data.series("reward/mean")
    rows = [("run dir", str(data.run_dir)), ("config", data.config_name or "n/a")]
    if s.get("algorithm"):
        rows.append(("algorithm", str(s["algorithm"])))
    if s.get("dataset"):
        rows.append(("dataset", str(s["dataset"])))
    if "reward_before" in s or "reward_after" in s:
        rows.append(
            ("eval reward before -> after RL", f"{_fmt(s.get('reward_before'))} -> {_fmt(s.get('reward_after'))}")
        )
    if "accuracy_before" in s or "accuracy_after" in s:
        rows.append(
            ("eval accuracy before -> after", f"{_fmt(s.get('accuracy_before'))} -> {_fmt(s.get('accuracy_after'))}")
        )
    if rewards:
        rows.append(("rollout reward, first -> last step", f"{rewards[0]:.3f} -> {rewards[-1]:.3f}"))
    rows.append(("RL steps", _fmt(s.get("steps", len(data.rl_metrics)))))
    if isinstance(s.get("wall_seconds"), (int, float)):
        rows.append(("training job wall time", f"{s['wall_seconds']:.0f} s"))
    else:
        step_s = sum(data.series("perf/step_s")[1])
        if step_s:
            why = "" if s else " (no summary.json: the run may still be going)"
            rows.append(("RL step time (sum)", f"{step_s:.0f} s{why}"))
    if s.get("sft_steps"):
        rows.append(
            (
                "SFT warm start",
                f"{s['sft_steps']} steps, loss {_fmt(s.get('sft_loss_first'))} -> {_fmt(s.get('sft_loss_last'))}",
            )
        )
    for key, label in (
        ("checkpoint", "checkpoint"),
        ("mlflow_run_id", "MLflow run"),
        ("registered_model_version", "registered model version"),
    ):
        if s.get(key) is not None:
            rows.append((label, str(s[key])))
    if not s:
        rows.append(("summary.json", "absent (a partial run: the figures come from the metrics alone)"))
    for name, n in sorted(data.skipped_lines.items()):
        rows.append((f"skipped lines of {name}", f"{n} (not JSON: a job still writing?)"))
    return rows


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.1f} MB" if n_bytes >= 1e6 else f"{max(n_bytes / 1e3, 0.1):.1f} KB"


def _panel_html(panel: Panel) -> str:
    parts = [f'<div class="panel" id="panel-{panel.key}"><h3>{html.escape(panel.title)}</h3>']
    if panel.note:
        parts.append(f'<div class="note" data-note="{panel.key}">{html.escape(panel.note)}</div>')
    if panel.figure is not None:
        parts.append(f'<div class="plot" id="plot-{panel.key}"></div>')
    parts.append("</div>")
    return "".join(parts)


def _trace_html(data: RunData) -> str:
    if data.trace_path is None:
        return (
            f'<div class="note" data-note="trace">{TRACE_FILE} is not in this run dir: the perf tracer was off. '
            "Set <code>trace.enabled: true</code> in the job config to record one.</div>"
        )
    path = html.escape(str(data.trace_path))
    return (
        f"<p>The perf trace of this run: <code>{path}</code> ({_size(data.trace_path.stat().st_size)}, "
        "Chrome trace-event JSON).</p><ol>"
        f'<li>Open <a href="{PERFETTO_UI}" target="_blank" rel="noopener">{PERFETTO_UI}</a> '
        "(the trace is read in your browser; it is not uploaded).</li>"
        f"<li>Choose <em>Open trace file</em> and pick <code>{path}</code>, or drag the file onto the page.</li>"
        "</ol><p>Offline, <code>chrome://tracing</code> (Load) reads the same file.</p>"
    )


def _episodes_html(data: RunData) -> tuple[str, dict[str, Any]]:
    if data.sessions is None:
        note = (
            f'<div class="note" data-note="episodes">{SESSIONS_FILE} is not in this run dir: session tracing '
            "was off, so there is no per-episode table.</div>"
        )
        return note, {"rows": None}
    rows, left_out = episode_rows(data.sessions)
    extra = (
        f" The first {left_out} episodes are left out (only the newest {len(rows)} are embedded)." if left_out else ""
    )
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    filters = (
        '<div id="filters">'
        '<label>status <select id="f-status"><option value="*">all</option></select></label>'
        '<label>reason <select id="f-reason"><option value="*">all</option></select></label>'
        '<label>trained step <input id="f-step-min" type="number" placeholder="min"> '
        '<input id="f-step-max" type="number" placeholder="max"></label>'
        '<label>reward <input id="f-reward-min" type="number" step="any" placeholder="min"> '
        '<input id="f-reward-max" type="number" step="any" placeholder="max"></label>'
        '<button id="f-reset" type="button">reset</button></div>'
    )
    body = (
        f'{filters}<p id="episode-count"></p>{html.escape(extra)}'
        f'<div style="max-height:600px;overflow:auto"><table id="episodes"><thead><tr>{head}</tr></thead>'
        "<tbody></tbody></table></div>"
    )
    return body, {"columns": list(COLUMNS), "rows": rows}


def render_html(data: RunData) -> str:
    """The whole page for ``data``."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    panels = build_panels(data)
    figures = {p.key: json.loads(pio.to_json(p.figure, validate=False)) for p in panels if p.figure is not None}
    summary = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{html.escape(value)}</td></tr>" for label, value in summary_rows(data)
    )
    episodes, table = _episodes_html(data)
    title = f"areal run report: {data.config_name or data.run_dir.name}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{CSS}</style>
<script>{get_plotlyjs()}</script>
</head><body>
<h1>{html.escape(title)}</h1>
<p class="sub">made by <code>areal report {html.escape(str(data.run_dir))}</code></p>
<h2>Summary</h2><table class="kv" id="summary">{summary}</table>
<h2>Training curves and timing</h2>
<div class="grid">{"".join(_panel_html(p) for p in panels)}</div>
<h2>Episodes</h2>{episodes}
<h2>Perf trace</h2><div id="trace">{_trace_html(data)}</div>
<script type="application/json" id="figures-data">{_script_json(figures)}</script>
<script type="application/json" id="episodes-data">{_script_json(table)}</script>
<script>{JS}</script>
</body></html>
"""


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``<run_dir>/report.html``); returns its path."""
    data = load_run(run_dir)
    target = Path(out).expanduser() if out else data.run_dir / REPORT_FILE
    page = render_html(data)
    if not target.parent.is_dir():
        raise ReportError(f"cannot write the report to {target}: {target.parent} is not a directory")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"cannot write the report to {target}: {exc}") from exc
    logger.info("run report of %s written to %s (%.1f MB)", data.run_dir, target, len(page) / 1e6)
    return target
