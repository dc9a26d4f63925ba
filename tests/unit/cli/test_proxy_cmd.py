"""``areal proxy``'s access policy, as ``areal serve``'s: the admin key comes from the environment
(never argv), no key is refused unless ``--allow-unauthenticated-admin`` on loopback, and a
non-loopback host always needs it; limit flags reach ``ProxyLimits`` and bad ones exit 2."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from areal_tasks.cli import build_parser
from areal_tasks.cli.proxy_cmd import admin_key_of
from areal_tasks.errors import ConfigError


def proxy_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["proxy", "--config", "job.yaml", *argv])


def test_the_admin_key_is_read_from_the_named_variable() -> None:
    args = proxy_args("--admin-api-key-env", "PROXY_ADMIN")
    assert admin_key_of(args, {"PROXY_ADMIN": "k3y"}) == ("k3y", False)
    with pytest.raises(ConfigError, match="PROXY_ADMIN is not set"):
        admin_key_of(args, {})
    with pytest.raises(ConfigError, match="PROXY_ADMIN is empty"):
        admin_key_of(args, {"PROXY_ADMIN": ""})
    remote = proxy_args("--admin-api-key-env", "PROXY_ADMIN", "--host", "0.0.0.0")
    assert admin_key_of(remote, {"PROXY_ADMIN": "k3y"}) == ("k3y", False)


def test_without_a_key_the_proxy_refuses_unless_opened_on_loopback() -> None:
    with pytest.raises(ConfigError, match="needs an admin key"):
        admin_key_of(proxy_args(), {})
    assert admin_key_of(proxy_args("--allow-unauthenticated-admin"), {}) == (None, True)
    with pytest.raises(ConfigError, match="not a loopback address"):
        admin_key_of(proxy_args("--host", "0.0.0.0", "--allow-unauthenticated-admin"), {})


def test_limit_flags_and_their_checks(tmp_path) -> None:
    args = proxy_args("--session-idle-timeout-s", "5", "--max-open-sessions", "3")
    assert args.idle_timeout_s == 5.0 and args.max_open_sessions == 3
    assert not hasattr(args, "admin_api_key")  # no flag takes the key itself
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "areal_tasks.cli",
            "proxy",
            "--config",
            str(tmp_path / "none.yaml"),
            "--allow-unauthenticated-admin",
            "--session-max-interactions",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "ProxyLimits.max_interactions=0" in done.stderr
