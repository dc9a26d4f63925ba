"""The report page's own CSS and JavaScript (no library beyond the inlined plotly.js).

The script draws every figure from the embedded JSON (``Plotly.newPlot``), then fills the episode
table from the embedded rows and re-filters it on every change of the filter inputs (status,
reason, trained-step range, reward range). ``window.arealReport`` exposes the figures and the
number of rows shown, for the browser test.
"""

from __future__ import annotations

CSS = """
body { font-family: system-ui, -apple-system, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em;
       color: #222; }
h1 { margin-bottom: 0.2em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.sub { color: #666; margin-top: 0; }
table.kv td { padding: 2px 12px 2px 0; vertical-align: top; }
table.kv td:first-child { color: #666; }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.panel { border: 1px solid #eee; border-radius: 6px; padding: 0.5em; }
.panel h3 { margin: 0.2em 0.4em; font-size: 1em; }
.note { color: #8a5a00; background: #fff8e6; border-left: 3px solid #e0a800; padding: 0.4em 0.8em; margin: 0.4em; }
#filters label { margin-right: 1em; white-space: nowrap; }
#filters input { width: 6em; }
#episodes { border-collapse: collapse; font-size: 0.85em; width: 100%; }
#episodes th, #episodes td { border-bottom: 1px solid #eee; padding: 2px 6px; text-align: left; }
#episodes th { position: sticky; top: 0; background: #fafafa; }
.status-accepted { color: #1a7f37; } .status-rejected { color: #9a6700; }
.status-failed { color: #cf222e; } .status-dropped { color: #666; }
code { background: #f4f4f4; padding: 1px 4px; border-radius: 3px; }
"""

JS = r"""
(function () {
  const figures = JSON.parse(document.getElementById('figures-data').textContent);
  const plotted = [];
  for (const [key, fig] of Object.entries(figures)) {
    const el = document.getElementById('plot-' + key);
    if (!el) continue;
    Plotly.newPlot(el, fig.data, fig.layout, {responsive: true, displaylogo: false});
    plotted.push(key);
  }
  const table = JSON.parse(document.getElementById('episodes-data').textContent);
  const state = {shown: 0, matching: 0};
  window.arealReport = {plotted: plotted, table: state, ready: false};
  if (!table.rows) { window.arealReport.ready = true; return; }
  const col = Object.fromEntries(table.columns.map((name, i) => [name, i]));
  const body = document.querySelector('#episodes tbody');
  const count = document.getElementById('episode-count');
  const get = (id) => document.getElementById(id);
  function num(id) { const v = get(id).value.trim(); return v === '' ? null : Number(v); }
  function fill(id, values) {
    const select = get(id);
    for (const v of [...new Set(values)].sort()) {
      const option = document.createElement('option');
      option.value = v; option.textContent = v === '' ? '(none)' : v;
      select.appendChild(option);
    }
  }
  fill('f-status', table.rows.map((r) => r[col.status]));
  fill('f-reason', table.rows.map((r) => r[col.reason]));
  const LIMIT = 500;
  function render() {
    const status = get('f-status').value, reason = get('f-reason').value;
    const s0 = num('f-step-min'), s1 = num('f-step-max'), r0 = num('f-reward-min'), r1 = num('f-reward-max');
    const out = [];
    let matching = 0;
    for (const r of table.rows) {
      if (status !== '*' && r[col.status] !== status) continue;
      if (reason !== '*' && r[col.reason] !== reason) continue;
      const step = r[col.trained_step], reward = r[col.reward];
      if ((s0 !== null || s1 !== null) && step === null) continue;
      if (s0 !== null && step < s0) continue;
      if (s1 !== null && step > s1) continue;
      if ((r0 !== null || r1 !== null) && reward === null) continue;
      if (r0 !== null && reward < r0) continue;
      if (r1 !== null && reward > r1) continue;
      matching++;
      if (out.length < LIMIT) out.push(r);
    }
    body.replaceChildren(...out.map((r) => {
      const tr = document.createElement('tr');
      r.forEach((v, i) => {
        const td = document.createElement('td');
        td.textContent = v === null ? '' : String(v);
        if (i === col.status) td.className = 'status-' + v;
        tr.appendChild(td);
      });
      return tr;
    }));
    state.shown = out.length; state.matching = matching;
    count.textContent = matching + ' of ' + table.rows.length + ' episodes match' +
      (matching > out.length ? ' (showing the first ' + out.length + ')' : '');
  }
  for (const id of ['f-status', 'f-reason', 'f-step-min', 'f-step-max', 'f-reward-min', 'f-reward-max']) {
    get(id).addEventListener('input', render);
    get(id).addEventListener('change', render);
  }
  get('f-reset').addEventListener('click', () => {
    for (const id of ['f-step-min', 'f-step-max', 'f-reward-min', 'f-reward-max']) get(id).value = '';
    get('f-status').value = '*'; get('f-reason').value = '*';
    render();
  });
  render();
  window.arealReport.render = render;
  window.arealReport.ready = true;
})();
"""
