"""Importing the config package and resolving a full config never imports torch (DAGs and the CLI rely on it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from areal_tasks.config import load_config, write_resolved, dump_config_yaml
cfg = load_config(sys.argv[1], ["experiment.run_dir=" + sys.argv[2], "algorithm.name=dapo"])
dump_config_yaml(cfg)
write_resolved(cfg)
heavy = sorted(m for m in ("torch", "transformers", "numpy") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


def test_load_and_resolve_without_torch(repo_root: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(repo_root / "configs" / "demo_grpo.yaml"), str(tmp_path)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "HEAVY:"
    assert (tmp_path / "config.yaml").is_file()
