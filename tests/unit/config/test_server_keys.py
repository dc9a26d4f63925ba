"""rollout.server.api_key_env / admin_api_key_env: names of variables, read only at job start."""

from __future__ import annotations

import pytest

from areal_tasks.config import JobConfig, load_config
from areal_tasks.config.validate import collect_problems
from areal_tasks.errors import ConfigError
from areal_tasks.trainer.rl import check_before_start


def test_loading_a_config_does_not_read_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AREAL_TEST_UNSET_KEY", raising=False)
    cfg = load_config(overrides=["rollout.server.api_key_env=AREAL_TEST_UNSET_KEY"])
    assert cfg.rollout.server.api_key_env == "AREAL_TEST_UNSET_KEY"
    assert collect_problems(cfg) == []


def test_read_keys() -> None:
    server = JobConfig().rollout.server
    assert server.read_keys({}) == (None, None)
    server.api_key_env, server.admin_api_key_env = "API", "ADMIN"
    assert server.read_keys({"API": "a", "ADMIN": "b"}) == ("a", "b")
    unset = r"rollout.server.admin_api_key_env='ADMIN': the environment variable ADMIN is not set"
    with pytest.raises(ConfigError, match=unset):
        server.read_keys({"API": "a"})
    with pytest.raises(ConfigError, match="API is empty"):
        server.read_keys({"API": "", "ADMIN": "b"})


def test_check_before_start_names_an_unset_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AREAL_TEST_UNSET_KEY", raising=False)
    cfg = JobConfig()
    cfg.rollout.server.api_key_env = "AREAL_TEST_UNSET_KEY"
    with pytest.raises(ConfigError, match="AREAL_TEST_UNSET_KEY is not set"):
        check_before_start(cfg)
    monkeypatch.setenv("AREAL_TEST_UNSET_KEY", "k")
    check_before_start(cfg)
