"""Stands in for the ``areal train --config <run_dir>/config.yaml`` a test submitted (see test_submit_follow.py).

Usage: ``fake_job.py PYTHON -m areal_tasks.cli train --config FILE``. Loads FILE with this process's
environment (``$AREAL_CONFIG_SECRETS`` gives the secrets back) as a local job, prints
``$FAKE_JOB_LINES`` log lines, writes ``<run_dir>/summary.json``, then hangs (``$FAKE_JOB_HANG``)
or exits with ``$FAKE_JOB_EXIT``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    assert argv[1:5] == ["-m", "areal_tasks.cli", "train", "--config"], argv
    from areal_tasks.config import load_config

    cfg = load_config(argv[5], ["cluster.scheduler=local"])
    ok = cfg.storage.options.get("secret") == "s3cr3t-value-for-the-test"
    print(f"loaded config: secret {'ok' if ok else 'missing'}", flush=True)
    for i in range(int(os.environ.get("FAKE_JOB_LINES", "3"))):
        print(f"fake job line {i}", flush=True)
        time.sleep(0.05)
    (Path(cfg.experiment.run_dir) / "summary.json").write_text(json.dumps({"steps": 1, "reward_after": 0.9}))
    if os.environ.get("FAKE_JOB_HANG"):
        time.sleep(600)
    return int(os.environ.get("FAKE_JOB_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
