"""``areal config show|validate``: exit codes, stdout/stderr, no tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

import areal_tasks.cli as cli
from areal_tasks.config import config_hash, load_config


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``run(*argv) -> (exit code, stdout, stderr)`` with only the config command registered."""
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("areal_tasks.cli.config_cmd",))

    def invoke(*argv: str) -> tuple[int, str, str]:
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err
        return code, out, err

    return invoke


def test_validate_ok_prints_hash(run, repo_root: Path, tmp_path: Path) -> None:
    recipe = str(repo_root / "configs" / "demo_grpo.yaml")
    code, out, _err = run("config", "validate", recipe, f"experiment.run_dir={tmp_path}")
    expected = config_hash(load_config(recipe, [f"experiment.run_dir={tmp_path}"]))
    assert (code, out) == (0, f"OK: {recipe} ({expected})\n")


def test_validate_invalid_lists_problems_on_stderr(run, repo_root: Path) -> None:
    code, out, err = run(
        "config",
        "validate",
        str(repo_root / "configs" / "demo_grpo.yaml"),
        "train.batch_size=10",
        "rollout.sampling.top_p=0",
    )
    assert code == 2 and out == ""
    assert err.startswith("areal config: error: invalid configuration (3 problems):")
    for field in ("train.batch_size", "rollout.sampling.top_p", "actor.micro_batch.granularity"):
        assert f"  - {field}: " in err


def test_unknown_key_exits_2_with_suggestion(run) -> None:
    code, _, err = run("config", "show", "actor.optimiser.lr=1e-6")
    assert code == 2
    assert "did you mean actor.optimizer?" in err


def test_validate_requires_a_file(run) -> None:
    code, _, err = run("config", "validate", "train.total_steps=3")
    assert code == 2 and "a config FILE is required" in err


def test_missing_file_exits_2(run, tmp_path: Path) -> None:
    code, _, err = run("config", "validate", str(tmp_path / "nope.yaml"))
    assert code == 2 and "config file not found" in err


def test_show_defaults_with_override_prints_loadable_yaml(run, tmp_path: Path) -> None:
    code, out, _ = run("config", "show", f"experiment.run_dir={tmp_path}", "train.total_steps=3")
    assert code == 0
    saved = tmp_path / "shown.yaml"
    saved.write_text(out, encoding="utf-8")
    assert load_config(saved) == load_config(None, [f"experiment.run_dir={tmp_path}", "train.total_steps=3"])


def test_write_flag_writes_run_dir_config(run, tmp_path: Path) -> None:
    code, out, _ = run(
        "config",
        "validate",
        "--write",
        str(Path(__file__).resolve().parents[3] / "configs" / "base.yaml"),
        f"experiment.run_dir={tmp_path}",
    )
    assert code == 0
    assert (tmp_path / "config.yaml").is_file()
    assert f"wrote {tmp_path / 'config.yaml'}" in out


def test_missing_action_is_a_usage_error(run) -> None:
    code, _, err = run("config")
    assert code == 2 and "usage:" in err


def test_validate_refuses_skypilot_as_a_scheduler_naming_the_launch_command(run, repo_root: Path) -> None:
    recipe = str(repo_root / "configs" / "demo_grpo.yaml")
    code, out, err = run("config", "validate", recipe, "cluster.scheduler=skypilot")
    assert code == 2 and out == ""
    assert "cluster.scheduler: 'skypilot' is a launcher, not a scheduler" in err
    assert "areal launch skypilot --config FILE" in err


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "actor.backend=megatron",
            "actor.backend: training backend 'megatron' is not built; built training backends: archon, fsdp",
        ),
        ("allocation=embedded:d1+megatron:d2", "training backend 'megatron' (component 'megatron:d2') is not built"),
        ("allocation=embedded:d1+fsdp:d2p2", "fsdp runs d (data), t (tensor) and c (context)"),
        ("allocation=embedded:d1+fsdp:d2e2", "fsdp runs d (data), t (tensor) and c (context)"),
    ],
)
def test_validate_refuses_what_is_not_built_with_exit_2(run, override: str, expected: str) -> None:
    code, out, err = run("config", "validate", "configs/base.yaml", override)
    assert code == 2 and out == ""
    assert expected in err
