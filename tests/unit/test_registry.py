"""The plug-in registry: lazy import paths, closest-name hints, refusals in the kind's error type."""

from __future__ import annotations

import sys

import pytest

from areal_tasks.errors import ConfigError, SchedulerError
from areal_tasks.registry import Registry


def test_lazy_entry_is_imported_on_first_get_only() -> None:
    sys.modules.pop("json.tool", None)
    reg: Registry = Registry("tool", {"json": "json.tool:main"})
    assert "json.tool" not in sys.modules  # listing names imports nothing
    assert reg.names() == ("json",)
    main = reg.get("json")
    assert callable(main) and "json.tool" in sys.modules


def test_unknown_name_names_the_closest_and_the_list_in_the_kinds_error() -> None:
    reg: Registry = Registry("scheduler", {"local": object, "ray": object}, error=SchedulerError)
    with pytest.raises(SchedulerError, match=r"unknown scheduler 'loca'; did you mean 'local'\? \(known: local, ray\)"):
        reg.get("loca")
    with pytest.raises(SchedulerError, match=r"known: local, ray"):
        reg.check("kubernetes")


def test_register_refuses_a_second_registration_unless_replaced() -> None:
    reg: Registry = Registry("engine backend", {"fsdp": dict})
    with pytest.raises(ConfigError, match="already registered"):
        reg.register("fsdp", list)
    reg.register("fsdp", list, replace=True)
    assert reg.build("fsdp", [1, 2]) == [1, 2]
    reg.unregister("fsdp")
    assert "fsdp" not in reg


@pytest.mark.parametrize(
    ("path", "message"),
    [("json", "not an import path"), ("no_such_module_xyz:f", "cannot import"), ("json:nope", "no attribute 'nope'")],
)
def test_bad_import_paths_are_refused_clearly(path: str, message: str) -> None:
    reg: Registry = Registry("thing", {"x": path})
    with pytest.raises(ConfigError, match=message):
        reg.get("x")
