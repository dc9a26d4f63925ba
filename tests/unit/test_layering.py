"""Architecture guards: imports flow one way, engines are reached through their registry, and the
parse-time surface stays torch-free.

``dags/ -> operators/ -> areal_tasks/ -> storage/``: storage knows nothing of RL, areal_tasks knows
nothing of Airflow, operators reach areal_tasks only inside functions (never at module import), and
the modules that Airflow or ``areal --help`` import at parse time never import torch. Outside
``engine/``, code reaches an engine implementation only through ``engine/registry.py`` (the shared
helpers ``microbatch``, ``packing``, ``image_rows``, ``memory`` and ``parallel`` excepted), and ``inference/`` and
``checkpoint/`` import nothing from ``engine/``; tests and benchmarks may import implementations.
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
    "areal_tasks.api.train_engine",
    "areal_tasks.engine.registry",
    "areal_tasks.engine.parallel.mesh",
    "areal_tasks.config",
    "areal_tasks.config.allocation",
    "areal_tasks.cli",
    "areal_tasks.models.detect",
    "areal_tasks.api.scheduler",
    "areal_tasks.agent.proxy",
    "areal_tasks.agent.proxy.server",
    "areal_tasks.agent.proxy.launch",
    "areal_tasks.cli.proxy_cmd",
    "areal_tasks.launch",
    "areal_tasks.agent",
    "areal_tasks.agent.tool_calls",
    "areal_tasks.agent.chat_render",
    "areal_tasks.agent.interactions",
    "areal_tasks.agent.client",
    "areal_tasks.evaluation",
    "areal_tasks.evaluation.metrics",
    "areal_tasks.config.trace",
    "areal_tasks.trace",
    "areal_tasks.trace.env",
    "areal_tasks.trace.merge",
    "areal_tasks.trace.schema",
    "areal_tasks.report",
    "areal_tasks.cli.report_cmd",
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


# -- engines: reached through the registry; the server and checkpoints know no engine ----------------

#: ``areal_tasks.engine.<name>`` modules that code outside ``engine/`` may import: the registry and
#: the engine-neutral helpers every engine shares.
ENGINE_PUBLIC = {"registry", "microbatch", "packing", "image_rows", "parallel"}
#: packages that import nothing from ``areal_tasks.engine`` at all: the servers and the client meet
#: the trainer only through ``areal_tasks.api`` and the weight transports, which belong to neither.
ENGINE_FREE = ("areal_tasks/inference", "areal_tasks/checkpoint", "areal_tasks/weights")


def _engine_imports(tree: ast.AST) -> set[str]:
    """``areal_tasks.engine.<name>`` first components imported anywhere in a module ("" for the bare
    package)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "areal_tasks.engine":
                modules = [f"areal_tasks.engine.{alias.name}" for alias in node.names]
            else:
                modules = [node.module]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[:2] == ["areal_tasks", "engine"]:
                found.add(parts[2] if len(parts) > 2 else "")
    return found


def _engine_offenders() -> dict[str, str]:
    """``{file: why}`` of every module outside ``engine/`` that breaks the engine import rules."""
    offenders: dict[str, str] = {}
    for package in ("areal_tasks", "operators", "dags"):
        for path in _python_files(package):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("areal_tasks/engine/"):
                continue
            imported = _engine_imports(ast.parse(path.read_text()))
            if rel.startswith(ENGINE_FREE) and imported:
                offenders[rel] = f"imports areal_tasks.engine.{sorted(imported)} (it must import nothing from engine/)"
            elif imported - ENGINE_PUBLIC:
                offenders[rel] = (
                    f"imports engine implementation(s) {sorted(imported - ENGINE_PUBLIC)}: build engines through "
                    "areal_tasks.engine.registry and type them with areal_tasks.api.train_engine"
                )
    return offenders


def test_engines_are_reached_only_through_the_registry() -> None:
    offenders = _engine_offenders()
    assert not offenders, "engine import rules broken:\n" + "\n".join(f"{k}: {v}" for k, v in offenders.items())


def test_weight_transports_belong_to_neither_side() -> None:
    """``areal_tasks/weights`` is imported by the trainer and by every server; it imports neither."""
    offenders = []
    for path in _python_files("areal_tasks/weights"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            module = None
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                module = node.module
            elif isinstance(node, ast.Import):
                module = next((a.name for a in node.names if a.name.startswith("areal_tasks.")), None)
            if module and module.startswith(("areal_tasks.engine", "areal_tasks.inference", "areal_tasks.trainer")):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, "weights/ must import neither an engine, the server nor the trainer:\n" + "\n".join(offenders)


def test_the_engine_import_rule_catches_every_spelling() -> None:
    cases = {
        "from areal_tasks.engine.fsdp.engine import FSDPEngine": {"fsdp"},
        "import areal_tasks.engine.fsdp.checkpoint": {"fsdp"},
        "from areal_tasks.engine import fsdp, registry": {"fsdp", "registry"},
        "def f():\n    from areal_tasks.engine.weights.shared import x": {"weights"},
        "from areal_tasks.engine.registry import build_engine": {"registry"},
        "import areal_tasks.engine": {""},
        "from areal_tasks.kernels.attention import register_attention": set(),
    }
    for code, expected in cases.items():
        assert _engine_imports(ast.parse(code)) == expected, code
