"""No secret of a job config reaches a file or a record people read (issue #26: ``config.yaml``,
``rl_config.yaml``, MLflow params and checkpoint ``metadata.json`` carried ``storage.options.secret``
and passwords in tracking URIs), and the processes that load the redacted file get the real values
back through ``$AREAL_CONFIG_SECRETS``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from areal_tasks.config import config_hash, config_to_dict, dump_config_yaml, load_config, write_resolved
from areal_tasks.config.secrets import (
    SECRETS_ENV,
    read_secrets_env,
    secret_values,
    secrets_env,
    split_secret_overrides,
)
from areal_tasks.config.serialize import dump_for_workers
from areal_tasks.errors import ConfigError
from storage.redact import REDACTED, clear_registered_secrets

SECRET_OVERRIDES = [
    "storage.options.secret=S3CRET2",
    "tracking.mlflow_uri=https://user:PASS3@mlflow.example/",
    "tracking.mlflow_artifact_location=https://bucket.example/a?X-Amz-Signature=SIGNATURE4",
]
SECRETS = ("S3CRET2", "PASS3", "SIGNATURE4")


@pytest.fixture(autouse=True)
def _no_registered_secrets():
    clear_registered_secrets()
    yield
    clear_registered_secrets()


@pytest.fixture
def cfg(tmp_path: Path):
    return load_config(
        "configs/demo_grpo.yaml",
        [f"experiment.run_dir={tmp_path / 'run'}", "storage.options.key=AKIAPUBLIC", *SECRET_OVERRIDES],
        environ={},
    )


def _clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, secret


def test_every_sink_is_redacted(cfg, tmp_path: Path) -> None:
    from areal_tasks.checkpoint.metadata import config_payload
    from areal_tasks.trainer.callbacks.mlflow import flatten_params

    assert cfg.storage.options == {"key": "AKIAPUBLIC", "secret": "S3CRET2"}  # the config itself is real
    resolved = write_resolved(cfg).read_text()
    _clean(resolved)
    assert f"config_hash: {config_hash(cfg)}" in resolved
    assert "secret: '***'" in resolved and "key: AKIAPUBLIC" in resolved
    assert "https://user:***@mlflow.example/" in resolved
    _clean(dump_config_yaml(cfg))
    params = flatten_params(config_to_dict(cfg))
    _clean(json.dumps(params))
    assert params["storage.options.secret"] == REDACTED and params["actor.optimizer.lr"]
    payload, digest = config_payload(cfg)
    _clean(json.dumps(payload))
    assert digest == config_hash(cfg)
    worker_file = tmp_path / "rl_config.yaml"
    env = dump_for_workers(cfg, worker_file)
    _clean(worker_file.read_text())
    assert set(env) == {SECRETS_ENV}


def test_show_secrets_is_the_real_config(cfg) -> None:
    assert "S3CRET2" in dump_config_yaml(cfg, show_secrets=True)
    assert config_to_dict(cfg, show_secrets=True)["tracking"]["mlflow_uri"] == "https://user:PASS3@mlflow.example/"


def test_the_hash_leaves_secrets_out(cfg, tmp_path: Path) -> None:
    rotated = load_config(
        "configs/demo_grpo.yaml",
        [
            f"experiment.run_dir={tmp_path / 'run'}",
            "storage.options.key=AKIAPUBLIC",
            "storage.options.secret=ROTATED",
            *SECRET_OVERRIDES[1:],
        ],
        environ={},
    )
    assert config_hash(rotated) == config_hash(cfg)


def test_a_worker_loads_the_redacted_file_plus_the_env_back_to_the_real_config(cfg, tmp_path: Path) -> None:
    worker_file = tmp_path / "rl_config.yaml"
    env = dump_for_workers(cfg, worker_file)
    assert load_config(worker_file, environ=env) == cfg
    without = load_config(worker_file, environ={})
    assert without.storage.options["secret"] == REDACTED and config_hash(without) == config_hash(cfg)


def test_the_rl_workers_get_the_secrets_in_their_environment_not_their_argv(cfg, tmp_path: Path) -> None:
    from areal_tasks.trainer.rl import rl_worker_spec

    worker_file = tmp_path / "rl_config.yaml"
    spec = rl_worker_spec(cfg, worker_file, ["127.0.0.1:1"], None, dump_for_workers(cfg, worker_file))
    _clean(" ".join(spec.command))
    probe = (
        "import sys; from areal_tasks.config import load_config; "
        "cfg = load_config(sys.argv[1]); print(cfg.storage.options['secret'], cfg.tracking.mlflow_uri)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(worker_file)],
        env={**_base_env(), **spec.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["S3CRET2", "https://user:PASS3@mlflow.example/"]


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != SECRETS_ENV}


def test_secret_overrides_are_told_apart() -> None:
    public, secret = split_secret_overrides(
        [
            *SECRET_OVERRIDES,
            "actor.optimizer.lr=1e-5",
            "storage.options={key: A, secret: B}",
            "rollout.server.api_key_env=K",
        ]
    )
    assert public == ["actor.optimizer.lr=1e-5", "rollout.server.api_key_env=K"]
    assert secret == [*SECRET_OVERRIDES, "storage.options={key: A, secret: B}"]


def test_a_mapping_override_moved_off_the_command_line_keeps_its_public_part(tmp_path: Path) -> None:
    overrides = [f"experiment.run_dir={tmp_path}", "storage.options={key: AKIAPUBLIC, secret: S3CRET2}"]
    cfg = load_config(None, overrides, environ={})
    public, secret = split_secret_overrides(overrides)
    env = secrets_env(cfg, secret)
    assert json.loads(env[SECRETS_ENV])["storage.options"] == {"key": "AKIAPUBLIC", "secret": "S3CRET2"}
    assert load_config(None, public, environ=env) == cfg


def test_secret_values_name_every_hidden_path(cfg) -> None:
    assert secret_values(cfg) == {
        "storage.options.secret": "S3CRET2",
        "tracking.mlflow_uri": "https://user:PASS3@mlflow.example/",
        "tracking.mlflow_artifact_location": "https://bucket.example/a?X-Amz-Signature=SIGNATURE4",
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"storage.options.secret": "S3CRET2"', "is not valid JSON"),
        ('["S3CRET2"]', "must be a JSON object"),
        ('{"storage.options..secret": "S3CRET2"}', "is not a dotted path"),
        ('{"storage.optionz.secret": "S3CRET2"}', "optionz"),
    ],
)
def test_a_bad_secrets_variable_is_refused_without_quoting_a_value(raw: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, [], environ={SECRETS_ENV: raw})
    assert expected in str(caught.value) and "S3CRET2" not in str(caught.value)


def test_values_read_from_the_variable_are_registered_for_redaction() -> None:
    from storage.redact import redact_text

    read_secrets_env({SECRETS_ENV: '{"storage.options.secret": "REGISTERED-S3CRET"}'})
    assert redact_text("boto said REGISTERED-S3CRET was wrong") == "boto said *** was wrong"
