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


def test_servers_of_a_cluster_scheduler_get_the_jobs_key_as_their_api_key() -> None:
    """A cluster scheduler's servers listen on a node address, which ``areal serve`` refuses without an
    API key: the generated key (``AREAL_SERVER_API_KEY``, set by the fleet) is their API key, and the
    job's clients send it; a local job's servers stay as they were."""
    from areal_tasks.inference.launch.commands import server_args

    cfg = load_config("configs/demo_grpo.yaml", ["cluster.scheduler=ray", "cluster.nodes=2"])
    assert server_args(cfg, "/m").api_key_env == "AREAL_SERVER_API_KEY"
    assert server_args(load_config("configs/demo_grpo.yaml"), "/m").api_key_env is None
    server = cfg.rollout.server
    assert server.read_keys({"AREAL_SERVER_ADMIN_KEY": "k", "AREAL_SERVER_API_KEY": "k"}) == ("k", "k")
    assert server.read_keys({"AREAL_SERVER_ADMIN_KEY": "k"}) == (None, "k")
    server.api_key_env = "MINE"
    assert server.read_keys({"MINE": "m", "AREAL_SERVER_API_KEY": "k"})[0] == "m"
