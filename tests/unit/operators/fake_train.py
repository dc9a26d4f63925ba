"""A stand-in for ``areal train`` in the operator tests: records how it was started, then behaves as
``$FAKE_TRAIN_MODE`` says: ``succeed`` (writes summary.json and a complete checkpoint), ``fail``
(exit 3), ``sleep`` (runs until killed)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    args = sys.argv[1:]
    overrides = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("--"))
    run_dir = Path(overrides["experiment.run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "argv": args,
        "mlflow_run_id": os.environ.get("AREAL_MLFLOW_RUN_ID"),
        "secrets_env": os.environ.get("AREAL_CONFIG_SECRETS"),
        "pid": os.getpid(),
    }
    with open(run_dir / "fake_calls.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    mode = os.environ.get("FAKE_TRAIN_MODE", "succeed")
    if mode == "fail":
        print("fake trainer: something broke", flush=True)
        return 3
    if mode == "sleep":
        with open(run_dir / "rl_metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": 1, "reward/mean": 0.25}) + "\n")
        time.sleep(120)
        return 0
    checkpoint = (
        run_dir / "storage" / os.environ.get("FAKE_EXPERIMENT", "demo_grpo") / "trial0" / "checkpoints" / "step_3"
    )
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "_COMPLETE").write_text("{}", encoding="utf-8")
    (run_dir / "summary.json").write_text(json.dumps({"reward_before": 0.4, "reward_after": 0.7, "steps": 3}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
