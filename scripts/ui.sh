#!/usr/bin/env bash
# `make ui`: the Airflow UI (`airflow standalone`: api-server, scheduler, dag-processor, triggerer)
# and the MLflow UI on 127.0.0.1, over the run data of `make run` (runs/latest, or $RUN_DIR):
#
#   Airflow  http://127.0.0.1:${AIRFLOW_UI_PORT:-8080}  AIRFLOW_HOME=$RUN_DIR/airflow (the make run DAG run is there)
#   MLflow   http://127.0.0.1:${MLFLOW_UI_PORT:-5000}   backend $RUN_DIR/mlflow.db, artifacts $RUN_DIR/mlartifacts
#
# The admin password is generated on the first start into
# $RUN_DIR/airflow/simple_auth_manager_passwords.json.generated (user admin). DAG runs triggered
# from the UI log to this MLflow server (connection areal_mlflow). Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
PROJECT="$(pwd)"
VENV="$PROJECT/.venv"
RUN_DIR="${RUN_DIR:-runs/latest}"
AIRFLOW_UI_PORT="${AIRFLOW_UI_PORT:-8080}"
MLFLOW_UI_PORT="${MLFLOW_UI_PORT:-5000}"
HOST=127.0.0.1

if [ ! -d "$RUN_DIR" ]; then
    echo "no run data at $RUN_DIR: run \`make run\` first (or set RUN_DIR to a run directory)" >&2
    exit 2
fi
RUN_DIR="$(cd "$RUN_DIR" && pwd -P)"

port_free() { "$VENV/bin/python" -c "import socket,sys; s=socket.socket(); s.bind(('$HOST', int(sys.argv[1])))" "$1" 2>/dev/null; }
for port in "$AIRFLOW_UI_PORT" "$MLFLOW_UI_PORT"; do
    if ! port_free "$port"; then
        echo "port $HOST:$port is in use; stop what holds it or set AIRFLOW_UI_PORT / MLFLOW_UI_PORT" >&2
        exit 2
    fi
done

export PATH="$VENV/bin:$PATH"   # airflow standalone starts its components as `airflow ...`
export AIRFLOW_HOME="$RUN_DIR/airflow"
export AIRFLOW__CORE__DAGS_FOLDER="$PROJECT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__PARALLELISM=4
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db"
export AIRFLOW__API__HOST="$HOST"
export AIRFLOW__API__PORT="$AIRFLOW_UI_PORT"
export AIRFLOW__API__BASE_URL="http://$HOST:$AIRFLOW_UI_PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://$HOST:$AIRFLOW_UI_PORT/execution/"
# Airflow's task-log servers: their defaults unless taken (another Airflow on this machine), else free ports
free_port() { "$VENV/bin/python" -c "import socket; s=socket.socket(); s.bind(('$HOST', 0)); print(s.getsockname()[1])"; }
port_free 8793 && AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=8793 || AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=$(free_port)
port_free 8794 && AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=8794 || AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=$(free_port)
export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT
export AIRFLOW_CONN_AREAL_MLFLOW="{\"conn_type\": \"generic\", \"host\": \"http://$HOST:$MLFLOW_UI_PORT\"}"
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
export AREAL_PROJECT_DIR="$PROJECT"
mkdir -p "$AIRFLOW_HOME" "$RUN_DIR/mlartifacts"

"$VENV/bin/mlflow" server --host "$HOST" --port "$MLFLOW_UI_PORT" --workers 1 \
    --backend-store-uri "sqlite:///$RUN_DIR/mlflow.db" --artifacts-destination "$RUN_DIR/mlartifacts" \
    >"$RUN_DIR/mlflow_server.log" 2>&1 &
MLFLOW_PID=$!
stop_mlflow() { kill "$MLFLOW_PID" 2>/dev/null && wait "$MLFLOW_PID" 2>/dev/null || true; }
trap stop_mlflow EXIT INT TERM

cat <<EOF

  Airflow UI  http://$HOST:$AIRFLOW_UI_PORT   user admin, password in
              $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated (written on the first start)
  MLflow UI   http://$HOST:$MLFLOW_UI_PORT   (log: $RUN_DIR/mlflow_server.log)
  run data    $RUN_DIR
  Ctrl-C stops both.

EOF
"$VENV/bin/airflow" standalone
