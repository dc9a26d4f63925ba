"""The client, the launchers and the API types import without torch (the controller and Airflow
parse-time code use them), and every inference module opens with a docstring."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_client_launch_and_api_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import areal_tasks.api.inference, areal_tasks.inference.client, areal_tasks.inference.launch\n"
        "from areal_tasks.inference.client import make_adapter\n"
        "make_adapter('sglang'); make_adapter('embedded')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_every_file_has_a_docstring() -> None:
    paths = [
        *(ROOT / "areal_tasks/inference/client").glob("*.py"),
        *(ROOT / "areal_tasks/inference/launch").glob("*.py"),
        ROOT / "areal_tasks/api/inference.py",
        ROOT / "areal_tasks/inference/__init__.py",
    ]
    missing = [str(p.relative_to(ROOT)) for p in paths if ast.get_docstring(ast.parse(p.read_text())) is None]
    assert not missing
