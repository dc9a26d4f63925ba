"""``areal alloc``: JSON on stdout and exit 0, or a caret-and-hint message on stderr and exit 2;
and the allocation package stays torch-free."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_tasks.cli import COMMAND_MODULES
from areal_tasks.cli.alloc_cmd import register, run_alloc
from areal_tasks.errors import AllocationError

ROOT = Path(__file__).resolve().parents[3]

# Runs the real ``areal_tasks.cli.main`` (its error printing and exit codes) with only this
# command registered, so these tests do not depend on the other command modules existing.
ALLOC_ONLY_MAIN = (
    "import sys, areal_tasks.cli as cli; "
    "cli.COMMAND_MODULES = ('areal_tasks.cli.alloc_cmd',); "
    "sys.exit(cli.main(sys.argv[1:]))"
)

MISSING_COMMANDS = [name for name in COMMAND_MODULES if importlib.util.find_spec(name) is None]
if importlib.util.find_spec("areal_tasks.cli.__main__") is None:
    MISSING_COMMANDS.append("areal_tasks.cli.__main__")


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)


def _parse_cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="areal")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_handler_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_alloc(_parse_cli(["alloc", "sglang:d2+fsdp:d4"])) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["total_gpus"] == 6
    assert [c["backend"] for c in data["components"]] == ["sglang", "fsdp"]


def test_handler_raises_allocation_error_for_bad_spec() -> None:
    with pytest.raises(AllocationError, match="needs 6 GPUs but the cluster has 4"):
        run_alloc(_parse_cli(["alloc", "sglang:d2+fsdp:d4", "--gpus", "4"]))


def test_subprocess_exit_0_with_json() -> None:
    result = _python("-c", ALLOC_ONLY_MAIN, "alloc", "sglang[rollout]:d4|fsdp[actor]:d4", "--gpus", "4")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["total_gpus"] == 4
    assert data["components"][1]["colocated_with"] == ["rollout"]
    assert result.stdout.startswith('{\n  "spec"')  # indent 2


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["alloc", "fsdp:d4p2"], ["FSDP has no pipeline parallelism", "fsdp:d4p2\n         ^", "hint: use megatron"]),
        (["alloc", "fsdpp:d4"], ["unknown backend 'fsdpp'", "did you mean 'fsdp'?"]),
        (["alloc", "sglang:d4+fsdp:d8", "--gpus", "8"], ["needs 12 GPUs but the cluster has 8"]),
    ],
)
def test_subprocess_exit_2_with_message(argv: list[str], expected: list[str]) -> None:
    result = _python("-c", ALLOC_ONLY_MAIN, *argv)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("areal alloc: error: invalid allocation spec")
    for fragment in expected:
        assert fragment in result.stderr


@pytest.mark.skipif(bool(MISSING_COMMANDS), reason=f"areal_tasks.cli cannot start yet: missing {MISSING_COMMANDS}")
def test_areal_cli_module_entry_point() -> None:
    ok = _python("-m", "areal_tasks.cli", "alloc", "sglang:d2+fsdp:d4")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["total_gpus"] == 6
    bad = _python("-m", "areal_tasks.cli", "alloc", "fsdp:d4p2")
    assert bad.returncode == 2
    assert "FSDP has no pipeline parallelism" in bad.stderr and "Traceback" not in bad.stderr


def test_import_is_torch_free() -> None:
    probe = (
        "import sys; import areal_tasks.config.allocation as a, areal_tasks.cli.alloc_cmd; "
        "a.parse_allocation('sglang:d2+megatron:(attn:d2|ffn:e2)'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    result = _python("-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
