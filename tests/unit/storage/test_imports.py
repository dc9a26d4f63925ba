"""storage stays light: file:// work (storage, commits, validation) never loads s3fs, botocore or torch,
and the package never imports areal_tasks (also enforced for every file by tests/unit/test_layering.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_local_work_loads_no_heavy_or_upper_layer_modules(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from storage import Storage\n"
        "from storage.validate import Thresholds, validate_storage\n"
        f"s = Storage.from_url({str(tmp_path)!r})\n"
        "with s.staged_directory('d') as d:\n"
        "    d.write_text('x', 'y')\n"
        "assert validate_storage(s.url, thresholds=Thresholds(probe_mb=1, latency_samples=1)).ok\n"
        "loaded = sorted(m for m in ('s3fs', 'botocore', 'aiobotocore', 'torch', 'areal_tasks', 'tqdm')"
        " if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
