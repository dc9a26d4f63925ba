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


def test_local_ray_and_slurm_are_the_built_kinds() -> None:
    assert scheduler_kinds() == ("local", "ray", "slurm")
    assert SCHEDULERS.get("local") is LocalScheduler
    assert unsupported_reason("local") is None
    check_scheduler("local")


def test_the_config_grammar_knows_the_built_and_the_planned_kinds() -> None:
    """``cluster.scheduler`` accepts exactly the built kinds plus the planned ones (refused by validation)."""
    hint = typing.get_type_hints(ClusterConfig)["scheduler"]
    assert set(typing.get_args(hint)) == set(scheduler_kinds()) | set(PLANNED_SCHEDULERS) | set(LAUNCHERS)
    assert not set(scheduler_kinds()) & set(PLANNED_SCHEDULERS)


def test_planned_kinds_are_refused_naming_the_supported_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kind of the grammar is built today; a kind planned later is refused by name, before anything starts."""
    import areal_tasks.launch.registry as registry

    monkeypatch.setattr(registry, "PLANNED_SCHEDULERS", ("k8s",))
    with pytest.raises(
        SchedulerError, match=r"scheduler 'k8s' \(planned, not built yet\).*supported schedulers: local, ray, slurm"
    ):
        check_scheduler("k8s")


def test_unknown_kinds_get_the_closest_built_name() -> None:
    assert unsupported_reason("lokal") == (
        "scheduler 'lokal' (unknown) is not supported; did you mean 'local'? supported schedulers: local, ray, slurm"
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


def test_every_built_kind_has_the_class_level_contract() -> None:
    """What ``areal train`` and Airflow call without an instance: inside or outside, preflight, the job backend."""
    for kind in scheduler_kinds():
        cls = SCHEDULERS.get(kind)
        for name in ("can_run_controller_here", "preflight"):
            assert callable(getattr(cls, name, None)), f"{kind}: {cls.__name__}.{name}"
        assert callable(getattr(JOB_BACKENDS.get(kind), "from_config", None)), kind


def test_local_runs_here_and_its_jobs_live_next_to_the_run_dir(tmp_path, monkeypatch) -> None:
    from areal_tasks.config import JobConfig
    from areal_tasks.launch.jobs import LocalJobs
    from areal_tasks.launch.registry import job_backend_for, preflight_for, runs_here

    monkeypatch.delenv("AREAL_JOBS_ROOT", raising=False)
    cfg = JobConfig()
    cfg.experiment.run_dir = str(tmp_path / "exp" / "trial")
    assert runs_here(cfg) is True
    backend = job_backend_for(cfg)
    assert isinstance(backend, LocalJobs) and backend.root == tmp_path / "exp" / "areal_jobs"
    monkeypatch.setenv("AREAL_JOBS_ROOT", str(tmp_path / "j"))
    assert job_backend_for(cfg).root == tmp_path / "j"
    report = preflight_for(cfg)
    assert report["ok"] and report["nodes"] == 1 and report["processes"] >= 1


def test_local_preflight_names_what_is_short(monkeypatch) -> None:
    from areal_tasks.config import JobConfig
    from areal_tasks.launch.registry import preflight_for

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cfg = JobConfig()
    cfg.cluster.gpus_per_node = 8
    cfg.cluster.memory_gb_per_node = 1e9
    with pytest.raises(
        SchedulerError, match=r"this machine cannot run the job:(.|\n)*this machine shows 0(.|\n)*GB required"
    ):
        preflight_for(cfg)


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
