#!/usr/bin/env bash
# `make run`: the training DAG `areal_rl_training`, end to end, with `airflow dags test` on the
# embedded default: Airflow on SQLite, MLflow on SQLite, local storage and the local scheduler, all
# under one run directory ($RUN_DIR, default runs/demo; runs/latest links to it):
#
#   $RUN_DIR/airflow/       AIRFLOW_HOME (airflow.db, logs, job records); the DAG folder is dags/
#   $RUN_DIR/mlflow.db      MLflow tracking + registry store; artifacts in $RUN_DIR/mlartifacts
#   $RUN_DIR/               the training job's run dir (config.yaml, sft/, rl_metrics.jsonl, storage/ ...)
#   $RUN_DIR/summary.json   the trainer's summary plus the pipeline's (checkpoint, MLflow run, model version)
#   $RUN_DIR/report.html    the run report (areal report; also an artifact of the MLflow run, under report/)
#   $RUN_DIR/airflow_dags_test.log   Airflow's full output (the terminal shows the pipeline's lines)
#
# The task is configs/demo_grpo.yaml: SFT warm start of a tiny Qwen2, then GRPO against one embedded
# inference server. `make ui` then shows the same run in the Airflow and MLflow UIs.
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT="$(pwd)"
PY="$PROJECT/.venv/bin/python"
AIRFLOW="$PROJECT/.venv/bin/airflow"
CONFIG="${CONFIG:-configs/demo_grpo.yaml}"
RUN_DIR="${RUN_DIR:-runs/demo}"
DAG_ID=areal_rl_training
DAG_CONF="${DAG_CONF:-}"    # more Params as JSON, e.g. DAG_CONF='{"max_steps": 320}'

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

# a fresh run each time (recovery would otherwise continue the previous demo's checkpoints)
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
ln -sfn "$RUN_DIR" runs/latest

export AIRFLOW_HOME="$RUN_DIR/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$PROJECT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__PARALLELISM=4
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db"
export AIRFLOW__LOGGING__COLORED_CONSOLE_LOG=False
export MLFLOW_TRACKING_URI="sqlite:///$RUN_DIR/mlflow.db"
export AREAL_PROJECT_DIR="$PROJECT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TOKENIZERS_PARALLELISM=false
mkdir -p "$AIRFLOW_HOME"

step "1/3 migrate the Airflow database ($AIRFLOW_HOME/airflow.db)"
started=$(date +%s)
if ! "$AIRFLOW" db migrate >"$AIRFLOW_HOME/db_migrate.log" 2>&1; then
    tail -n 30 "$AIRFLOW_HOME/db_migrate.log"
    echo "airflow db migrate failed; full log: $AIRFLOW_HOME/db_migrate.log" >&2
    exit 1
fi
echo "done in $(( $(date +%s) - started )) s"

# Params of the DAG run: the demo config, this run directory; MLflow from $MLFLOW_TRACKING_URI.
CONF="$("$PY" - "$CONFIG" "$RUN_DIR" "$DAG_CONF" <<'EOF'
import json, sys
conf = {"config": sys.argv[1], "run_dir": sys.argv[2]}
conf.update(json.loads(sys.argv[3]) if sys.argv[3].strip() else {})
print(json.dumps(conf))
EOF
)"

step "2/3 airflow dags test $DAG_ID --conf '$CONF'"
echo "(the pipeline's own lines below; Airflow's full output goes to $RUN_DIR/airflow_dags_test.log)"
# Keep the lines of the pipeline (loggers areal.*, the operators' hooks, operators and triggers, the
# training job's progress), every warning and error, and the start and end of each task; drop
# Airflow's own bookkeeping. The full, unfiltered output is in the log file.
FILTER='
import re, sys
start_re = re.compile(r"^\d{4}-\d\d-\d\dT\S+Z \[(\w+)\s*\] (.*)$")  # structlog: time [level] message
end_re = re.compile(r"^(.*?)\s+\[([\w.]+)\](?: \w+=.*)?$")         # ... [logger] key=value ...
keep_logger = re.compile(r"(^areal|(^|\.)operators\.(operators|hooks|triggers)\.)")
noisy = re.compile(r"graphviz|necessary system packages|GitWildMatchPattern")

def emit(level, lines, logger):
    text = "\n".join(lines)
    if noisy.search(text):
        return
    first = lines[0]
    if first.startswith("[DAG TEST] starting task_id="):
        task = first.split("task_id=", 1)[1].split()[0]
        index = first.rsplit("map_index=", 1)[-1]
        print(f"--- task {task}" + (f"[{index}]" if index not in ("-1", "") else ""), flush=True)
    elif first.startswith("DagRun Finished"):
        state = re.search(r"state=(\w+)", first)
        print(f"--- DAG run finished: {state.group(1) if state else first}", flush=True)
    elif keep_logger.search(logger) or level in ("warning", "error", "critical"):
        prefix = "    " if level == "info" else f"    {level.upper()}: "
        print(prefix + text.replace("\n", "\n    "), flush=True)

record = None  # (level, lines) of a record whose "[logger]" end has not been seen yet
for raw in sys.stdin:
    line = raw.rstrip("\n")
    started = start_re.match(line)
    if started:
        if record:
            emit(record[0], record[1], "")
        record = (started.group(1), [started.group(2)])
    elif record is None:
        if line.strip() and not noisy.search(line):
            print(line, flush=True)  # plain output: a print, a traceback, MLflow
        continue
    else:
        record[1].append(line)
    ended = end_re.match(record[1][-1])
    if ended:
        record[1][-1] = ended.group(1)
        emit(record[0], record[1], ended.group(2))
        record = None
    elif len(record[1]) > 200:
        emit(record[0], record[1], "")
        record = None
if record:
    emit(record[0], record[1], "")
'
started=$(date +%s)
set +e
"$AIRFLOW" dags test "$DAG_ID" --conf "$CONF" 2>&1 | tee "$RUN_DIR/airflow_dags_test.log" | "$PY" -u -c "$FILTER"
status=${PIPESTATUS[0]}
set -e
elapsed=$(( $(date +%s) - started ))
if [ "$status" -ne 0 ]; then
    echo "the DAG run failed after ${elapsed} s (exit $status); see the lines above and $RUN_DIR/airflow_dags_test.log" >&2
    exit "$status"
fi

step "3/3 summary (runs/latest/summary.json; DAG run took ${elapsed} s)"
"$PY" - "$RUN_DIR/summary.json" <<'EOF'
import json, sys
from pathlib import Path

path = Path(sys.argv[1])
if not path.is_file():
    sys.exit(f"{path} is missing: the DAG run ended without writing its summary")
s = json.loads(path.read_text())
missing = [k for k in ("reward_before", "reward_after", "checkpoint", "mlflow_run_id", "registered_model_version")
           if s.get(k) is None]
if missing:
    sys.exit(f"{path} lacks {missing}")

def f(key):
    value = s.get(key)
    return f"{value:.3f}" if isinstance(value, (int, float)) else "n/a"

print(f"{'':<16} {'before RL':>10} {'after RL':>10}")
print(f"{'eval reward':<16} {f('reward_before'):>10} {f('reward_after'):>10}")
print(f"{'eval accuracy':<16} {f('accuracy_before'):>10} {f('accuracy_after'):>10}")
print(f"{'greedy accuracy':<16} {f('greedy_accuracy_before'):>10} {f('greedy_accuracy_after'):>10}")
if "sft_steps" in s:
    print(f"SFT warm start: {s['sft_steps']} steps, loss {s['sft_loss_first']:.3f} -> {s['sft_loss_last']:.3f}")
print(f"RL: {s.get('algorithm')}, {s.get('steps')} steps; training job {s.get('wall_seconds', 0):.0f} s")
print(f"checkpoint:       {s['checkpoint']}")
print(f"MLflow run:       {s['mlflow_run_id']} ({s.get('mlflow_tracking_uri')})")
print(f"registered model: {s.get('registered_model_name')} version {s['registered_model_version']} "
      f"(aliases: {', '.join(s.get('registered_model_aliases') or []) or 'none'})")
print(f"summary:          {path}")
report = s.get("report")
if report:
    print(f"run report:       {Path(report).resolve().as_uri()}  (open it in a browser; also `areal report RUN_DIR`)")
    print(f"MLflow artifacts: {s.get('report_artifacts')} ({', '.join(s.get('report_files') or [])})")
    trace = Path(report).with_name("trace.json")
    if trace.is_file():
        print(f"perf trace:       {trace}  (open it in https://ui.perfetto.dev: Open trace file)")
else:
    print("run report:       not written by this pipeline; make one with `areal report runs/latest`")
EOF
echo "runs/latest -> $RUN_DIR; \`make ui\` opens it in the Airflow and MLflow UIs"
