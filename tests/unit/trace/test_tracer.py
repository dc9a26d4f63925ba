"""The perf tracer: nesting, the disabled no-op, step sampling, lanes, merging part files, the format check."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from areal_tasks import trace
from areal_tasks.errors import TraceError
from areal_tasks.trace.env import TRACE_DIR_ENV, TRACE_EVERY_ENV, TRACE_ROLE_ENV, configure_from_env
from areal_tasks.trace.tracer import NULL_SPAN, Tracer


@pytest.fixture
def tracer(tmp_path: Path):
    t = trace.install(Tracer(tmp_path / "trace", "train rank 0"))
    yield t
    trace.uninstall()


def _load(run_dir: Path) -> dict:
    trace.flush()
    return json.loads(trace.merge_trace(run_dir).read_text())


def _spans(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_disabled_span_is_the_shared_no_op() -> None:
    trace.uninstall()
    s = trace.span("optimizer step", "train", n=1)
    assert s is NULL_SPAN
    with s as inner:
        inner.set(x=1)


def test_spans_nest_and_merge_into_a_valid_trace(tmp_path: Path, tracer: Tracer) -> None:
    with trace.span("rl step", "train"):
        with trace.span("forward", "train", micro_batch=0) as s:
            time.sleep(0.001)
            s.set(tokens=12)
        with trace.span("backward", "train"):
            pass
    doc = _load(tmp_path)
    assert trace.check_trace(doc) == []
    spans = {e["name"]: e for e in _spans(doc)}
    outer, fwd, bwd = spans["rl step"], spans["forward"], spans["backward"]
    assert outer["ts"] <= fwd["ts"] and fwd["ts"] + fwd["dur"] <= bwd["ts"] <= outer["ts"] + outer["dur"]
    assert fwd["args"] == {"micro_batch": 0, "tokens": 12}
    assert fwd["dur"] >= 1000  # microseconds
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"train rank 0"}
    assert doc["displayTimeUnit"] == "ms" and "otherData" in doc


def test_an_exception_is_recorded_and_raised(tmp_path: Path, tracer: Tracer) -> None:
    with pytest.raises(KeyError), trace.span("checkpoint save", "checkpoint"):
        raise KeyError("x")
    (span,) = _spans(_load(tmp_path))
    assert span["args"]["error"] == "KeyError"


def test_only_sampled_steps_are_recorded(tmp_path: Path) -> None:
    trace.install(Tracer(tmp_path / "trace", "controller", every_n_steps=3))
    try:
        with trace.span("start-up", "train"):  # outside any step: recorded
            pass
        for step in range(1, 8):
            trace.set_step(step)
            with trace.span("rl step", "train"):
                pass
    finally:
        trace.uninstall()
    steps = [e.get("args", {}).get("step") for e in _spans(_load(tmp_path))]
    assert sorted(steps, key=lambda s: s or 0) == [None, 1, 4, 7]


def test_concurrent_spans_take_lanes_that_nest(tmp_path: Path, tracer: Tracer) -> None:
    a = trace.span("generate", "generate", concurrent=True)
    b = trace.span("generate", "generate", concurrent=True)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    c = trace.span("generate", "generate", concurrent=True)
    c.__enter__()  # takes a's lane again
    b.__exit__(None, None, None)
    c.__exit__(None, None, None)
    doc = _load(tmp_path)
    assert trace.check_trace(doc) == []
    tids = [e["tid"] for e in _spans(doc)]
    assert len(set(tids)) == 2


def test_max_events_drops_and_says_so(tmp_path: Path) -> None:
    t = trace.install(Tracer(tmp_path / "trace", "server 0", max_events=2))
    for _ in range(5):
        with trace.span("generate", "server"):
            pass
    trace.uninstall()
    doc = _load(tmp_path)
    assert len(_spans(doc)) == 2 and t.dropped == 3
    labels = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_labels"]
    assert any("dropped 3" in label for label in labels)


def test_threads_get_their_own_tid_and_name(tmp_path: Path, tracer: Tracer) -> None:
    def work() -> None:
        with trace.span("reward", "reward"):
            pass

    thread = threading.Thread(target=work, name="reward-pool")
    thread.start()
    thread.join()
    with trace.span("rl step", "train"):
        pass
    doc = _load(tmp_path)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert "reward-pool" in names
    assert len({e["tid"] for e in _spans(doc)}) == 2


def test_merge_of_several_parts_keeps_processes_apart_and_skips_cut_lines(tmp_path: Path) -> None:
    parts = tmp_path / "trace"
    for role in ("controller", "server 0"):
        t = Tracer(parts, role)
        t.pid = 4242  # two hosts, one pid
        t._buffer = [{**e, "pid": 4242} for e in t._buffer]
        t.path = parts / f"{role.replace(' ', '_')}.jsonl"
        trace.install(t)
        with trace.span("x", "server" if role != "controller" else "train"):
            pass
        trace.uninstall()
    with open(parts / "controller.jsonl", "a") as f:
        f.write(
            '{"name": "cut',
        )
    doc = _load(tmp_path)
    assert trace.check_trace(doc) == []
    assert len({e["pid"] for e in _spans(doc)}) == 2
    assert doc["otherData"]["skipped_lines"] == 1


def test_merge_without_parts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no perf trace part files"):
        trace.merge_trace(tmp_path)
    from areal_tasks.trace.merge import main

    assert main([str(tmp_path)]) == 2


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ({"name": "a", "cat": "train", "ph": "X", "ts": 1, "dur": -1, "pid": 1, "tid": 1}, "dur must be"),
        ({"name": "a", "cat": "nope", "ph": "X", "ts": 1, "dur": 1, "pid": 1, "tid": 1}, "category"),
        ({"name": "a", "cat": "train", "ph": "B", "ts": 1, "pid": 1, "tid": 1}, "phase"),
        ({"name": "a", "cat": "train", "ph": "X", "ts": 1, "dur": 1, "pid": "1", "tid": 1}, "pid must"),
        ({"name": "bogus", "ph": "M", "pid": 1, "tid": 1, "args": {}}, "unknown metadata"),
    ],
)
def test_the_format_check_names_each_problem(event: dict, problem: str) -> None:
    (found,) = trace.check_trace({"traceEvents": [event]})
    assert problem in found


def test_the_format_check_finds_spans_that_overlap_without_nesting() -> None:
    events = [
        {"name": "a", "cat": "train", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"name": "b", "cat": "train", "ph": "X", "ts": 5, "dur": 10, "pid": 1, "tid": 1},
        {"name": "c", "cat": "train", "ph": "X", "ts": 5, "dur": 10, "pid": 1, "tid": 2},
    ]
    (found,) = trace.check_trace({"traceEvents": events})
    assert "'b'" in found and "without nesting" in found


def test_configure_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert configure_from_env("x", {}) is None
    env = {TRACE_DIR_ENV: str(tmp_path / "trace"), TRACE_EVERY_ENV: "2", TRACE_ROLE_ENV: "server 3"}
    try:
        t = configure_from_env("server", env)
        assert t is trace.current() and t.role == "server 3" and t.every_n_steps == 2
        assert configure_from_env("server", env) is t
    finally:
        trace.uninstall()


def test_a_forked_child_does_not_inherit_the_tracer(tmp_path: Path, tracer: Tracer) -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if trace.current() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_weak_step_does_not_override_the_loops(tmp_path: Path, tracer: Tracer) -> None:
    tracer.set_step(5, weak=True)  # a server or rollout process: the version's guess holds
    assert tracer.step == 5
    tracer.set_step(2)  # the RL loop of this process sets it from now on
    tracer.set_step(3, weak=True)
    assert tracer.step == 2


def test_a_part_file_that_cannot_be_written_turns_the_tracer_off(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    t = trace.install(Tracer(tmp_path / "file" / "trace", "rollout"))  # a directory under a file
    try:
        with trace.span("generate", "generate"):
            pass
        t.flush()
        t.set_step(1)
        assert trace.span("generate", "generate") is NULL_SPAN
    finally:
        trace.uninstall()
