"""Bad input to the ``areal`` command is one clear ``error:`` line and exit 2, never a traceback, and
a secret in the input does not come back in the output (issue #26: ``model tiny --set
hidden_size=-1`` and ``--out`` under a file raised, ``storage validate --probe-mb 1e9`` ran out of
memory, ``lr=.inf`` and ``total_steps=1e23`` validated, ``s3://KEY:SECRET@bucket`` was echoed).

Each row runs :func:`areal_tasks.cli.main` in this process. (Checkpoint-specific rows belong to
the checkpoint package's tests.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.cli import main

SECRET = "TOPSECRET9"

ROWS = {
    "tiny negative size": (
        ["model", "tiny", "--family", "qwen2", "--out", "{tmp}/t", "--set", "hidden_size=-1"],
        "hidden_size=-1",
    ),
    "tiny absurd size": (
        ["model", "tiny", "--family", "qwen2", "--out", "{tmp}/t", "--set", "num_hidden_layers=100000"],
        "num_hidden_layers",
    ),
    "tiny out under a file": (["model", "tiny", "--family", "qwen2", "--out", "{tmp}/afile/sub"], "is a file"),
    "probe too large": (["storage", "validate", "{tmp}/sv", "--probe-mb", "1e9"], "probe_mb"),
    "probe not a number": (["storage", "validate", "{tmp}/sv", "--probe-mb", "nan"], "probe_mb"),
    "threshold infinite": (["storage", "validate", "{tmp}/sv", "--min-free-gb", "inf"], "min_free_gb"),
    "too many probe nodes": (["storage", "validate", "{tmp}/sv", "--nodes", "100000"], "--nodes"),
    "s3 url with credentials": (["storage", "validate", f"s3://AKIAXX:{SECRET}@bucket/x"], "AWS_ACCESS_KEY_ID"),
    "checkpoint list with credentials": (["checkpoint", "list", f"s3://AKIAXX:{SECRET}@bucket/x"], "AWS_ACCESS_KEY_ID"),
    "lr infinite": (["config", "validate", "configs/demo_grpo.yaml", "actor.optimizer.lr=.inf"], "finite"),
    "lr overflows": (["config", "validate", "configs/demo_grpo.yaml", "actor.optimizer.lr=1e400"], "finite"),
    "timeout nan": (["config", "validate", "configs/demo_grpo.yaml", "rollout.request_timeout_s=.nan"], "finite"),
    "steps beyond int64": (
        ["config", "validate", "configs/demo_grpo.yaml", "train.total_steps=100000000000000000000000"],
        "64-bit",
    ),
    "steps absurd": (["config", "validate", "configs/demo_grpo.yaml", "train.total_steps=10000000000"], "implausibly"),
    "batch absurd": (["config", "validate", "configs/demo_grpo.yaml", "train.batch_size=1000000000"], "implausibly"),
    "config storage url with credentials": (
        ["config", "show", "configs/demo_grpo.yaml", f"storage.url=s3://AKIAXX:{SECRET}@bucket/x"],
        "carries credentials",
    ),
    "misspelt secret override": (
        ["config", "show", "configs/demo_grpo.yaml", f"storage.optionz.secret={SECRET}"],
        "optionz",
    ),
    "malformed secret override": (
        ["config", "show", "configs/demo_grpo.yaml", f"--aws-secret-access-key={SECRET}"],
        "error",
    ),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_bad_input_is_one_error_line_and_exit_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv, expected = ROWS[name]
    (tmp_path / "afile").write_text("not a directory")
    monkeypatch.delenv("AREAL_CONFIG_SECRETS", raising=False)
    monkeypatch.setenv("AREAL_CACHE_DIR", str(tmp_path / "cache"))
    try:
        code = main([part.replace("{tmp}", str(tmp_path)) for part in argv])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, err
    assert len([line for line in err.splitlines() if "error:" in line]) == 1, err
    assert expected in err and "Traceback" not in err
    assert SECRET not in err + out


def test_config_show_redacts_and_show_secrets_reveals(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    overrides = [
        f"experiment.run_dir={tmp_path}",
        f"storage.options.secret={SECRET}",
        f"tracking.mlflow_uri=https://user:{SECRET}@mlflow.example/",
    ]
    assert main(["config", "show", "configs/demo_grpo.yaml", *overrides, "--write"]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err and "secret: '***'" in out and "https://user:***@mlflow.example/" in out
    assert SECRET not in (tmp_path / "config.yaml").read_text()
    assert main(["config", "show", "configs/demo_grpo.yaml", *overrides, "--show-secrets"]) == 0
    assert SECRET in capsys.readouterr().out
