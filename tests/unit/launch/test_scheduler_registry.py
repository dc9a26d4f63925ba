"""The one scheduler registry: which kinds are built, how the others are refused, and that the
config grammar, the factory and the refusal all read it."""

from __future__ import annotations

import typing

import pytest

from areal_tasks.api.scheduler import Scheduler
from areal_tasks.config.cluster import ClusterConfig
from areal_tasks.errors import SchedulerError
from areal_tasks.launch import LocalScheduler, make_scheduler
from areal_tasks.launch.registry import (
    JOB_BACKENDS,
    LAUNCHERS,
    PLANNED_SCHEDULERS,
    SCHEDULERS,
    check_scheduler,
    scheduler_kinds,
    unsupported_reason,
)


def test_local_and_ray_are_built_kinds() -> None:
    assert {"local", "ray"} <= set(scheduler_kinds())
    assert SCHEDULERS.get("local") is LocalScheduler
    assert unsupported_reason("local") is None
    check_scheduler("local")


def test_the_config_grammar_knows_the_built_and_the_planned_kinds() -> None:
    """``cluster.scheduler`` accepts exactly the built kinds plus the planned ones (refused by validation)."""
    hint = typing.get_type_hints(ClusterConfig)["scheduler"]
    assert set(typing.get_args(hint)) == set(scheduler_kinds()) | set(PLANNED_SCHEDULERS) | set(LAUNCHERS)
    assert not set(scheduler_kinds()) & set(PLANNED_SCHEDULERS)


@pytest.mark.parametrize("kind", PLANNED_SCHEDULERS)
def test_planned_kinds_are_refused_naming_the_supported_ones(kind: str) -> None:
    with pytest.raises(
        SchedulerError, match=rf"scheduler '{kind}' \(planned, not built yet\).*supported schedulers: local"
    ):
        check_scheduler(kind)


def test_unknown_kinds_get_the_closest_built_name() -> None:
    assert str(unsupported_reason("lokal")).startswith(
        "scheduler 'lokal' (unknown) is not supported; did you mean 'local'? supported schedulers: local, ray"
    )
    assert "did you mean" not in str(unsupported_reason("kubernetes"))


def test_a_registered_kind_is_built_by_make_scheduler(tmp_path) -> None:
    class Fake(LocalScheduler):
        """A second kind, registered for this test only."""

    SCHEDULERS.register("fake", Fake)
    try:
        assert "fake" in scheduler_kinds()
        sched = make_scheduler("fake", run_dir=tmp_path, devices=[], handle_signals=False)
        assert isinstance(sched, Fake) and isinstance(sched, Scheduler)
    finally:
        SCHEDULERS.unregister("fake")
    with pytest.raises(SchedulerError, match="unknown"):
        make_scheduler("fake")


def test_skypilot_is_refused_as_a_launcher_naming_the_command() -> None:
    with pytest.raises(SchedulerError, match=r"'skypilot' is a launcher, not a scheduler: .*areal launch skypilot"):
        check_scheduler("skypilot")


def test_every_built_scheduler_has_a_job_backend_and_a_from_config() -> None:
    assert set(JOB_BACKENDS.names()) == set(scheduler_kinds())
    for kind in scheduler_kinds():
        assert callable(getattr(SCHEDULERS.get(kind), "from_config", None)), kind


def test_make_scheduler_for_builds_the_configured_kind_on_the_run_dir(tmp_path) -> None:
    from areal_tasks.config import JobConfig
    from areal_tasks.launch.registry import make_job_backend, make_scheduler_for

    cfg = JobConfig()
    cfg.experiment.run_dir = str(tmp_path / "run")
    scheduler = make_scheduler_for(cfg)
    try:
        assert isinstance(scheduler, LocalScheduler)
        assert scheduler.run_dir == (tmp_path / "run").resolve()
        (node,) = scheduler.nodes()
        assert (node.index, node.address) == (0, "127.0.0.1") and node.cpus >= 1
    finally:
        scheduler.stop_all()
    backend = make_job_backend("local", root=tmp_path / "jobs")
    assert backend.status("nothing").state == "missing"
