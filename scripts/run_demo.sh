#!/usr/bin/env bash
# `make run`: the RL demo job on the embedded default (CPU), through `areal train`.
# Resolves and validates the job, parses its allocation, detects the tiny model it names and
# recommends a layout, then runs the job: an SFT warm start of the tiny model on two gloo workers,
# one embedded inference server, and GRPO with the asynchronous rollout executor, all started
# through the LocalScheduler. The summary (reward before and after RL) goes to
# $RUN_DIR/summary.json; runs/latest links to the run dir. The orchestration issue replaces this
# with the training DAG.
set -euo pipefail
cd "$(dirname "$0")/.."
AREAL=".venv/bin/areal"
PY=".venv/bin/python"
CONFIG="${CONFIG:-configs/demo_grpo.yaml}"
RUN_DIR="${RUN_DIR:-runs/demo}"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

# a fresh run each time (recovery would otherwise continue the previous demo's checkpoints)
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"

step "1/4 resolve and validate $CONFIG"
$AREAL config validate "$CONFIG" "experiment.run_dir=$RUN_DIR" --write
read -r ALLOC MODEL < <($PY -c "from areal_tasks.config import load_config; c = load_config('$CONFIG'); print(c.allocation, c.model.path)")

step "2/4 parse the allocation '$ALLOC'"
$AREAL alloc "$ALLOC"

step "3/4 build and detect the model '$MODEL'; recommend a layout for 8 GPUs"
$AREAL model detect "$MODEL" --gpus 8 | tee "$RUN_DIR/model_detect.json"

step "4/4 train: SFT warm start, then GRPO against the embedded server (progress bars below)"
$AREAL train --config "$CONFIG" "experiment.run_dir=$RUN_DIR"
ln -sfn "$(cd "$RUN_DIR" && pwd)" runs/latest
echo "runs/latest -> $RUN_DIR"
