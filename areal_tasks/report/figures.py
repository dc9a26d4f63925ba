"""The run report's plots, one function per figure, each a :class:`Panel` built from :class:`RunData`.

A panel whose data the run does not have carries no figure but a ``note`` saying what is missing
and why (e.g. the staleness histogram without ``sessions.jsonl`` falls back to the executor's
histogram in ``summary.json`` or the per-step staleness metrics, and says so). plotly is imported
here, so this module loads only when a report is made (never by ``areal --help``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go

from areal_tasks.report.data import SESSIONS_FILE, RunData

HEIGHT = 320


@dataclass
class Panel:
    """One plot of the report: ``figure`` None means ``note`` says why there is none."""

    key: str
    title: str
    figure: go.Figure | None = None
    note: str | None = None


def _figure(ytitle: str, xtitle: str = "RL step") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        height=HEIGHT,
        margin={"l": 60, "r": 20, "t": 50, "b": 45},
        xaxis_title=xtitle,
        yaxis_title=ytitle,
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
        template="plotly_white",
    )
    return fig


def _curves(data: RunData, key: str, title: str, ytitle: str, series: list[tuple[str, str]]) -> Panel:
    """A line per metric of ``series`` ((metric key, legend name)) that the run has."""
    fig = _figure(ytitle)
    for metric, name in series:
        steps, values = data.series(metric)
        if steps:
            fig.add_trace(go.Scatter(x=steps, y=values, mode="lines+markers", name=name, marker={"size": 4}))
    if not fig.data:
        wanted = ", ".join(metric for metric, _ in series)
        return Panel(key, title, note=f"no {wanted} in rl_metrics.jsonl (no RL step logged yet?)")
    return Panel(key, title, fig)


#: the reward curve's moving average window (drawn when the run has at least twice as many steps).
ROLLING = 10


def reward_panel(data: RunData) -> Panel:
    panel = _curves(data, "reward", "Reward", "reward", [("reward/mean", "reward/mean (rollout batch)")])
    if panel.figure is not None:
        steps, values = data.series("reward/mean")
        if len(values) >= 2 * ROLLING:
            smooth = [
                sum(values[max(i - ROLLING + 1, 0) : i + 1]) / len(values[max(i - ROLLING + 1, 0) : i + 1])
                for i in range(len(values))
            ]
            panel.figure.add_trace(
                go.Scatter(x=steps, y=smooth, mode="lines", name=f"mean of the last {ROLLING} steps", line={"width": 3})
            )
        steps = [item["step"] for item in data.evals if isinstance(item.get("mean_reward"), (int, float))]
        if steps:
            values = [item["mean_reward"] for item in data.evals if isinstance(item.get("mean_reward"), (int, float))]
            panel.figure.add_trace(
                go.Scatter(x=steps, y=values, mode="markers", name="eval mean_reward", marker={"size": 10})
            )
    return panel


def kl_panel(data: RunData) -> Panel:
    return _curves(
        data, "kl", "KL divergence", "KL", [("actor/approx_kl", "actor/approx_kl"), ("kl_ref/mean", "kl_ref/mean")]
    )


def entropy_panel(data: RunData) -> Panel:
    return _curves(data, "entropy", "Entropy", "entropy (nats/token)", [("actor/entropy", "actor/entropy")])


def length_panel(data: RunData) -> Panel:
    return _curves(
        data,
        "length",
        "Response length",
        "tokens",
        [("response_len/mean", "response_len/mean"), ("seq_len/mean", "seq_len/mean")],
    )


def throughput_panel(data: RunData) -> Panel:
    """samples/s (``rollout/n_samples`` / ``perf/step_s``) and tokens/s on a second axis."""
    title = "Throughput"
    fig = _figure("samples/s")
    samples_x, samples_y = [], []
    for row in data.rl_metrics:
        n, step_s = row.get("rollout/n_samples"), row.get("perf/step_s")
        if isinstance(n, (int, float)) and isinstance(step_s, (int, float)) and step_s > 0:
            samples_x.append(int(row.get("step", len(samples_x) + 1)))
            samples_y.append(n / step_s)
    if samples_x:
        fig.add_trace(go.Scatter(x=samples_x, y=samples_y, mode="lines", name="samples/s"))
    steps, tokens = data.series("perf/tokens_per_s")
    if steps:
        fig.add_trace(go.Scatter(x=steps, y=tokens, mode="lines", name="tokens/s", yaxis="y2"))
        fig.update_layout(yaxis2={"title": "tokens/s", "overlaying": "y", "side": "right"})
    if not fig.data:
        return Panel("throughput", title, note="no rollout/n_samples, perf/step_s or perf/tokens_per_s in rl_metrics")
    return Panel("throughput", title, fig)


#: the step's phases, stacked; "other" is what ``perf/step_s`` holds beyond them.
PHASES = (
    ("perf/rollout_wait_s", "waiting for rollouts", "#9aa5b1"),
    ("perf/train_s", "training", "#e4572e"),
    ("perf/weight_update_s", "weight update", "#17a398"),
)
OTHER_COLOR = "#d9d9d9"


def timeline_panel(data: RunData) -> Panel:
    """One stacked bar per step: rollout wait, training, weight update, the rest of ``perf/step_s``."""
    title = "Step timeline"
    fig = _figure("seconds")
    fig.update_layout(barmode="stack", bargap=0.05)
    rows = [row for row in data.rl_metrics if any(isinstance(row.get(k), (int, float)) for k, _, _ in PHASES)]
    if not rows:
        return Panel("timeline", title, note="no perf/rollout_wait_s, perf/train_s or perf/weight_update_s metrics")
    steps = [int(row.get("step", i + 1)) for i, row in enumerate(rows)]
    for metric, name, color in PHASES:
        values = [float(row.get(metric) or 0.0) for row in rows]
        fig.add_trace(go.Bar(x=steps, y=values, name=name, marker_color=color))
    other = []
    for row in rows:
        total = row.get("perf/step_s")
        known = sum(float(row.get(metric) or 0.0) for metric, _, _ in PHASES)
        other.append(max(float(total) - known, 0.0) if isinstance(total, (int, float)) else 0.0)
    if any(other):
        fig.add_trace(go.Bar(x=steps, y=other, name="other (rest of perf/step_s)", marker_color=OTHER_COLOR))
    return Panel("timeline", title, fig)


def staleness_panel(data: RunData) -> Panel:
    """Histogram of trained samples' staleness: per episode from sessions.jsonl, else the executor's
    ``staleness_hist`` in summary.json, else the per-step ``staleness/mean``."""
    title = "Staleness"
    fig = _figure("count", xtitle="staleness (policy versions)")
    if data.sessions is not None:
        values = [row["staleness"] for row in data.sessions if isinstance(row.get("staleness"), (int, float))]
        if values:
            counts = Counter(int(v) for v in values)
            xs = sorted(counts)
            fig.add_trace(go.Bar(x=xs, y=[counts[x] for x in xs], name="episodes (sessions.jsonl)"))
            return Panel("staleness", title, fig)
        fallback = f"{SESSIONS_FILE} has no episode with a staleness (none trained yet?)"
    else:
        fallback = f"{SESSIONS_FILE} is not in this run dir (session tracing off)"
    hist = (data.summary.get("executor") or {}).get("staleness_hist")
    if isinstance(hist, dict) and hist:
        counts = {int(k): int(v) for k, v in hist.items() if str(k).lstrip("-").isdigit()}
        xs = sorted(counts)
        fig.update_layout(yaxis_title="samples")
        fig.add_trace(go.Bar(x=xs, y=[counts[x] for x in xs], name="trained samples (summary.json)"))
        return Panel("staleness", title, fig, note=f"{fallback}: the executor's staleness_hist of summary.json instead")
    steps, values = data.series("staleness/mean")
    if steps:
        fig.update_layout(xaxis_title="per-step mean staleness (policy versions)", yaxis_title="steps")
        fig.add_trace(go.Histogram(x=values, name="steps (staleness/mean)"))
        return Panel("staleness", title, fig, note=f"{fallback}: a histogram of the per-step staleness/mean instead")
    return Panel("staleness", title, note=f"{fallback}, and rl_metrics.jsonl has no staleness/mean")


#: episodes drawn in the episode timeline (the first ones admitted; a long run has far more).
TIMELINE_EPISODES = 2000


def episode_timeline_panel(data: RunData) -> Panel:
    """One horizontal bar per episode from admission to its end, coloured by status (sessions.jsonl)."""
    title = "Episode timeline"
    if data.sessions is None:
        return Panel("sessions", title, note=f"{SESSIONS_FILE} is not in this run dir (session tracing off)")
    timed = [
        row
        for row in data.sessions
        if isinstance(row.get("admitted_t"), (int, float)) and isinstance(row.get("end_t"), (int, float))
    ]
    if not timed:
        return Panel("sessions", title, note=f"{SESSIONS_FILE} has no episode with admitted_t and end_t yet")
    timed.sort(key=lambda row: row["admitted_t"])
    shown, t0 = timed[:TIMELINE_EPISODES], timed[0]["admitted_t"]
    fig = _figure("episode (by admission)", xtitle="seconds since the first admission")
    fig.update_layout(barmode="overlay", bargap=0.0, height=HEIGHT + 80)
    for status in ("accepted", "rejected", "failed", "dropped"):
        rows = [(i, row) for i, row in enumerate(shown) if row.get("status") == status]
        if rows:
            fig.add_trace(
                go.Bar(
                    y=[i for i, _ in rows],
                    x=[max(row["end_t"] - row["admitted_t"], 0.0) for _, row in rows],
                    base=[row["admitted_t"] - t0 for _, row in rows],
                    orientation="h",
                    name=status,
                    customdata=[row.get("episode", "") for _, row in rows],
                    hovertemplate="%{customdata}: %{base:.2f} s + %{x:.2f} s<extra>" + status + "</extra>",
                )
            )
    note = f"the first {len(shown)} of {len(timed)} episodes" if len(timed) > len(shown) else None
    return Panel("sessions", title, fig, note=note)


def sft_panel(data: RunData) -> Panel:
    title = "SFT warm start loss"
    steps = [int(row.get("step", i + 1)) for i, row in enumerate(data.sft_metrics) if "loss" in row]
    values = [float(row["loss"]) for row in data.sft_metrics if "loss" in row]
    if not steps:
        return Panel("sft", title, note="no sft_metrics.jsonl (no SFT warm start in this run)")
    fig = _figure("loss", xtitle="SFT step")
    fig.add_trace(go.Scatter(x=steps, y=values, mode="lines", name="loss"))
    return Panel("sft", title, fig)


#: every panel of the report, in page order.
PANELS: tuple[Callable[[RunData], Panel], ...] = (
    reward_panel,
    kl_panel,
    entropy_panel,
    length_panel,
    throughput_panel,
    timeline_panel,
    staleness_panel,
    episode_timeline_panel,
    sft_panel,
)


def build_panels(data: RunData) -> list[Panel]:
    return [make(data) for make in PANELS]


def figure_json(fig: go.Figure) -> dict[str, Any]:
    """The figure as plain JSON (data + layout) for ``Plotly.newPlot``."""
    return fig.to_plotly_json()
