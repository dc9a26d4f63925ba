#!/usr/bin/env bash
# `make run`: the most complete real work that exists so far, on the embedded default (CPU).
# Resolves and validates the demo job, parses its allocation, builds the tiny model it names,
# detects it and recommends a layout, then runs the demo pipeline (areal_tasks/trainer/demo.py):
# the base model evaluated on the arithmetic eval split through the embedded inference server, an
# SFT warm start with the FSDP2 engine on two gloo workers started through the LocalScheduler, and
# the SFT model evaluated the same way. The summary goes to $RUN_DIR/summary.json; runs/latest
# links to the run dir. The orchestration issue replaces this with the training DAG.
set -euo pipefail
cd "$(dirname "$0")/.."
AREAL=".venv/bin/areal"
PY=".venv/bin/python"
CONFIG="${CONFIG:-configs/demo_grpo.yaml}"
RUN_DIR="${RUN_DIR:-runs/demo}"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "1/5 resolve and validate $CONFIG"
$AREAL config validate "$CONFIG" "experiment.run_dir=$RUN_DIR" --write
ALLOC=$($PY -c "from areal_tasks.config import load_config; print(load_config('$CONFIG').allocation)")

step "2/5 parse the allocation '$ALLOC'"
$AREAL alloc "$ALLOC"

step "3/5 build the tiny model (hidden 128, MLP 256, 4 heads of 32, 2 KV heads)"
# the kit's default (hidden 64) underfits 2-digit addition; this width learns some of it
$AREAL model tiny --family qwen2 --out "$RUN_DIR/model" --set hidden_size=128 --set intermediate_size=256 \
    --set num_attention_heads=4 --set num_key_value_heads=2 > "$RUN_DIR/model_tiny.json"
echo "model written to $RUN_DIR/model"

step "4/5 detect it and recommend a layout for 8 GPUs"
$AREAL model detect "$RUN_DIR/model" --gpus 8 | tee "$RUN_DIR/model_detect.json"

step "5/5 evaluate, SFT warm-start on 2 gloo workers (LocalScheduler), evaluate again"
$PY -m areal_tasks.trainer.demo --config "$CONFIG" "experiment.run_dir=$RUN_DIR" \
    "model.path=$RUN_DIR/model" --latest runs/latest
