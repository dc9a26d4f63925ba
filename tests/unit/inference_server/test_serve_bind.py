"""``areal serve`` is closed by default: no open non-loopback bind, no open admin routes.

A non-loopback ``--host`` without an API key exits 2 before any model is loaded (the model path
here does not exist) unless ``--allow-unauthenticated``. Without any key, an admin key is made and
written to a 0600 file whose path is logged, never the key; ``--allow-unauthenticated-admin``
opens the admin routes instead. The middleware refuses admin routes of a keyless server.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

from areal_tasks.cli import build_parser, serve_cmd
from areal_tasks.cli.serve_cmd import admin_access, is_loopback, remove_admin_key, safety_config
from areal_tasks.errors import ConfigError
from areal_tasks.inference.server.auth import request_allowed

ROOT = Path(__file__).resolve().parents[3]


def serve_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", "--model", "/nonexistent-model", *argv])


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", ""])
def test_a_public_bind_without_an_api_key_exits_2_before_loading_the_model(host: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "areal_tasks.cli", "serve", "--model", str(tmp_path / "missing"), "--host", host],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "is not a loopback address and no API key is set" in done.stderr
    assert "--allow-unauthenticated" in done.stderr and "Traceback" not in done.stderr


def test_loopback_hosts() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    assert not is_loopback("") and not is_loopback("no-such-host.invalid")


def test_a_public_bind_is_allowed_with_an_api_key_or_when_told(tmp_path: Path, caplog) -> None:
    env = {"HOME": str(tmp_path)}
    with pytest.raises(ConfigError, match="not a loopback address"):
        admin_access(serve_args("--host", "0.0.0.0"), None, "admin-key", env)
    assert admin_access(serve_args("--host", "0.0.0.0"), "api-key", None, env) == (None, False)
    with caplog.at_level(logging.WARNING):
        key, open_admin = admin_access(serve_args("--host", "0.0.0.0", "--allow-unauthenticated"), None, None, env)
    assert key and not open_admin  # still an admin key: the two opt-outs are separate
    assert "SERVING WITHOUT AN API KEY ON 0.0.0.0" in caplog.text


def test_without_keys_an_admin_key_is_written_to_a_private_file(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.INFO):
        key, open_admin = admin_access(serve_args("--port", "31234"), None, None, {"HOME": str(tmp_path)})
    path = tmp_path / ".cache" / "areal" / "serve-31234.admin-key"
    assert not open_admin and key and path.read_text() == key and len(key) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert str(path) in caplog.text and key not in caplog.text
    again, _ = admin_access(serve_args("--port", "31234"), None, None, {"HOME": str(tmp_path)})
    assert again != key and path.read_text() == again  # a new key per start
    runtime = tmp_path / "run"
    runtime.mkdir()
    admin_access(serve_args("--port", "31235"), None, None, {"XDG_RUNTIME_DIR": str(runtime), "HOME": "/nowhere"})
    assert (runtime / "areal" / "serve-31235.admin-key").is_file()


def test_the_generated_key_file_goes_when_the_server_stops_but_not_a_later_servers(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    key, _ = admin_access(serve_args("--port", "31236"), None, None, env)
    path = tmp_path / ".cache" / "areal" / "serve-31236.admin-key"
    path.write_text("a later server's key")
    remove_admin_key(31236, key, env)
    assert path.read_text() == "a later server's key"  # not this server's file any more
    path.write_text(key)
    remove_admin_key(31236, key, env)
    assert not path.exists()
    remove_admin_key(31236, key, env)  # already gone: nothing to do


@pytest.mark.parametrize("fails", [False, True])
def test_run_serve_removes_its_generated_key_file_however_serving_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = tmp_path / ".cache" / "areal" / "serve-31237.admin-key"
    served = []

    def serve(args, api_key, admin_api_key, open_admin) -> None:
        served.append(path.read_text() == admin_api_key)
        if fails:
            raise RuntimeError("the model did not load")

    monkeypatch.setattr(serve_cmd, "_serve", serve)
    if fails:
        with pytest.raises(RuntimeError, match="did not load"):
            serve_cmd.run_serve(serve_args("--port", "31237"))
    else:
        assert serve_cmd.run_serve(serve_args("--port", "31237")) == 0
    assert served == [True] and not path.exists()


def test_a_given_admin_key_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("AREAL_TEST_GIVEN_ADMIN", "given-admin-key")
    keys = []
    monkeypatch.setattr(serve_cmd, "_serve", lambda args, api, admin, open_admin: keys.append(admin))
    assert serve_cmd.run_serve(serve_args("--admin-api-key-env", "AREAL_TEST_GIVEN_ADMIN")) == 0
    assert keys == ["given-admin-key"] and not (tmp_path / ".cache").exists()


def test_a_key_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".cache" / "areal").mkdir(parents=True)
    (tmp_path / ".cache" / "areal").chmod(0o777)
    with pytest.raises(ConfigError, match="not a directory only you may write"):
        admin_access(serve_args(), None, None, {"HOME": str(tmp_path)})


def test_given_keys_are_used_and_the_admin_opt_out_opens_admin_routes(tmp_path: Path, caplog) -> None:
    env = {"HOME": str(tmp_path)}
    assert admin_access(serve_args(), None, "mine", env) == ("mine", False)
    assert admin_access(serve_args(), "api", None, env) == (None, False)  # SGLang: the API key opens admin routes
    with caplog.at_level(logging.WARNING):
        assert admin_access(serve_args("--allow-unauthenticated-admin"), None, None, env) == (None, True)
    assert "ADMIN ROUTES OPEN" in caplog.text
    assert not (tmp_path / ".cache").exists()


def test_weight_roots_and_bounds_reach_the_server_config() -> None:
    fields = safety_config(
        serve_args(
            "--weight-root", "/a", "--weight-root", "/b", "--weight-group-timeout-s", "2", "--shutdown-timeout-s", "3"
        )
    )
    assert fields["weights"].roots == ("/a", "/b") and fields["weights"].group_timeout_s == 2.0
    assert fields["weights"].load_timeout_s == 600.0 and fields["weights"].drain_timeout_s == 30.0
    assert fields["shutdown_timeout_s"] == 3.0


@pytest.mark.parametrize("path", ["/pause_generation", "/update_weights_from_disk", "/areal/swap_weights"])
def test_a_keyless_server_refuses_admin_routes_unless_opened(path: str) -> None:
    assert not request_allowed(path, "POST", None, None, None)
    assert not request_allowed(path, "POST", "Bearer anything", None, None)
    assert request_allowed(path, "POST", None, None, None, open_admin=True)
    assert request_allowed("/generate", "POST", None, None, None)
    assert request_allowed("/health", "GET", None, None, None)


def test_the_switch_interval_flag_reaches_the_config_and_the_serving_process(monkeypatch) -> None:
    """``--switch-interval-us`` becomes ``ServerConfig.switch_interval_us``, which ``run_server`` sets
    while it serves and restores after; the default is the module's."""
    import areal_tasks.inference.server as server_pkg
    from areal_tasks.cli.serve_cmd import run_serve
    from areal_tasks.inference.server import server as server_mod
    from areal_tasks.inference.server import shutdown

    configs = []
    monkeypatch.setattr(server_pkg, "run_server", configs.append)
    run_serve(serve_args("--allow-unauthenticated-admin"))
    run_serve(serve_args("--allow-unauthenticated-admin", "--switch-interval-us", "250"))
    assert [cfg.switch_interval_us for cfg in configs] == [server_mod.DEFAULT_SWITCH_INTERVAL_US, 250.0]

    seen = []
    monkeypatch.setattr(server_mod, "build_app", lambda cfg: types.SimpleNamespace(state=types.SimpleNamespace()))
    monkeypatch.setattr("areal_tasks.gc_heap.freeze_startup_heap", lambda: None)
    monkeypatch.setattr(shutdown, "serve_until_stopped", lambda app, **kw: seen.append(sys.getswitchinterval()))
    saved = sys.getswitchinterval()
    server_mod.run_server(configs[1])
    assert seen == [pytest.approx(250e-6)] and sys.getswitchinterval() == saved


@pytest.mark.parametrize("value", [0.0, -5.0, float("nan"), float("inf"), 2e6])
def test_a_switch_interval_out_of_range_is_refused(value: float) -> None:
    from areal_tasks.errors import InferenceError
    from areal_tasks.inference.server.server import ServerConfig

    with pytest.raises(InferenceError, match="switch_interval_us"):
        ServerConfig(model_path="x", switch_interval_us=value)
