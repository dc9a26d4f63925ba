"""Architecture guards: imports flow one way and the parse-time surface stays torch-free.

``dags/ -> operators/ -> areal_tasks/ -> storage/``: storage knows nothing of RL, areal_tasks knows
nothing of Airflow, operators reach areal_tasks only inside functions (never at module import), and
the modules that Airflow or ``areal --help`` import at parse time never import torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python_files(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def _imported_modules(tree: ast.AST, *, module_level_only: bool) -> set[str]:
    """Top-level package names imported by a module (optionally only at module level)."""
    names: set[str] = set()
    nodes = ast.iter_child_nodes(tree) if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


FORBIDDEN = {
    # package: (top-level packages it must never import, anywhere in its code)
    "storage": {"areal_tasks", "operators", "airflow", "dags"},
    "areal_tasks": {"operators", "airflow", "dags"},
    "operators": {"dags"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_flow_one_way(package: str) -> None:
    offenders = []
    for path in _python_files(package):
        imported = _imported_modules(ast.parse(path.read_text()), module_level_only=False)
        bad = imported & FORBIDDEN[package]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, "imports must flow dags -> operators -> areal_tasks -> storage:\n" + "\n".join(offenders)


def test_operators_reach_areal_tasks_only_inside_functions() -> None:
    offenders = []
    for path in _python_files("operators"):
        top = _imported_modules(ast.parse(path.read_text()), module_level_only=True)
        if {"areal_tasks", "torch"} & top:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, (
        f"import areal_tasks/torch inside execute() or a trigger's run(), not at module level: {offenders}"
    )


# Modules that Airflow's DAG processor, the config loader or `areal --help` import at parse time.
TORCH_FREE_MODULES = [
    "areal_tasks",
    "areal_tasks.errors",
    "areal_tasks.api.batch",
    "areal_tasks.config",
    "areal_tasks.config.allocation",
    "areal_tasks.cli",
    "areal_tasks.models.detect",
    "areal_tasks.api.scheduler",
    "areal_tasks.launch",
    "storage",
    "operators",
]


def test_parse_time_modules_do_not_import_torch() -> None:
    code = (
        "import importlib, sys\n"
        f"mods = {TORCH_FREE_MODULES!r}\n"
        "for m in mods:\n"
        "    importlib.import_module(m)\n"
        "from areal_tasks.cli import build_parser\n"
        "build_parser()\n"
        "heavy = sorted(k for k in ('torch', 'transformers', 'peft') if k in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"parse-time modules imported {out.stdout.strip()}"


def test_every_python_file_has_a_module_docstring() -> None:
    missing = []
    for package in ("areal_tasks", "operators", "storage", "dags", "tests", "benchmarks"):
        for path in _python_files(package):
            if path.name == "__init__.py" and not path.read_text().strip():
                continue
            if ast.get_docstring(ast.parse(path.read_text())) is None:
                missing.append(str(path.relative_to(ROOT)))
    assert not missing, f"files without a module docstring: {missing}"


def _imported_module_paths(tree: ast.AST) -> set[str]:
    """Full dotted names of every absolute import anywhere in a module (``from a.b import c`` gives ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# Imports of engine/ that another change of issue #25 removes (the attention kernels move out of
# engine/fsdp/ to kernels/); an entry that no longer imports engine/ fails the test: delete it.
_INFERENCE_ENGINE_IMPORTS_BEING_MOVED = {"areal_tasks/inference/server/attention.py"}


def test_inference_imports_nothing_from_engine() -> None:
    """The servers (embedded, the vLLM plugin) and the client meet the trainer only through
    ``areal_tasks.api`` and the weight transports of ``areal_tasks.weights``, never an engine."""
    offenders, moved = [], set()
    for path in _python_files("areal_tasks/inference"):
        imported = _imported_module_paths(ast.parse(path.read_text()))
        bad = sorted(m for m in imported if m == "areal_tasks.engine" or m.startswith("areal_tasks.engine."))
        name = str(path.relative_to(ROOT))
        if bad and name in _INFERENCE_ENGINE_IMPORTS_BEING_MOVED:
            moved.add(name)
        elif bad:
            offenders.append(f"{name} imports {bad}")
    assert not offenders, "inference/ must not import areal_tasks.engine:\n" + "\n".join(offenders)
    stale = sorted(_INFERENCE_ENGINE_IMPORTS_BEING_MOVED - moved)
    assert not stale, f"these no longer import areal_tasks.engine; remove them from the list: {stale}"
