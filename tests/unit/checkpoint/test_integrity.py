"""Damaged checkpoints are caught before they are trained on or shipped (issue #26, items 2 and 6).

A toy engine saves steps 1 and 2 (step 2 incremental: it references step 1's frozen embedding); then
one kind of damage is done to step 2: flipped bytes inside a tensor item, an edited ``engines.json``,
a truncated data file, an edited ``metadata.json``. Asserted: ``list`` marks the step ``corrupt``
(flipped item bytes only with ``--verify``: sizes and small files still match), ``verify`` exits 2
naming the file (and the tensor), ``recover`` falls back to step 1, says so,
quarantines step 2 and a later save of step 2 succeeds; ``recover.verify=false`` loads the flipped
bytes. Plus: a damaged parent that step 2 reads, a garbled old step that used to break every later
save, deeply nested or huge ``metadata.json``, an index missing keys, ``list`` of a missing folder.
Export of a damaged checkpoint: ``test_export_safety.py`` (it needs an HF model).
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
import torch

from areal_tasks.checkpoint.layout import COMPLETE_MARKER, QUARANTINE_MARKER
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.cli import main
from areal_tasks.errors import CheckpointError, CheckpointIntegrityError
from tests.unit.checkpoint import damage
from tests.unit.checkpoint.damage import rewrite_index_consistently

TENSOR = "engines.actor.model.1.weight"  # the trainable Linear: written anew by step 2
FROZEN = "engines.actor.model.0.weight"  # the frozen embedding: step 2 references step 1's bytes


def flip_item(folder: Path, fqn: str = TENSOR, step: int = 2) -> Path:
    return damage.flip_item(folder, fqn, step)


DAMAGE = {
    "item": flip_item,
    "engines": damage.edit_engines,
    "truncated": damage.truncate_data,
    "metadata": damage.edit_metadata,
}


def _save(engine, manager, step):
    engine.train_step()
    state = TrainerState(step=step, version=engine.get_version(), dataloader={"index": step})
    manager.save(step, {"actor": engine}, state, {"loss": 1.0 / step}).wait()


@pytest.fixture
def run(tmp_path, file_url, toy_engine, make_manager):
    """(manager, engine after step 2, params at step 1, params at step 2, checkpoints folder path)."""
    engine = toy_engine(seed=0)
    manager = make_manager(file_url, keep_last=5)
    _save(engine, manager, 1)
    step1 = engine.params()
    _save(engine, manager, 2)
    return manager, engine, step1, engine.params(), tmp_path / "store/exp/trial/checkpoints"


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_list_marks_the_damaged_step_and_keeps_listing(run, capsys, kind):
    manager, *_, folder = run
    damaged = DAMAGE[kind](folder)
    cheap = {i.step: i for i in manager.list()}
    deep = {i.step: i for i in manager.list(deep=True)}
    assert cheap[1].status == deep[1].status == "complete"
    assert deep[2].status == "corrupt" and damaged.name in deep[2].problem
    assert cheap[2].status == ("complete" if kind == "item" else "corrupt"), "a flipped item keeps every size"
    code, out, _ = _cli(capsys, "checkpoint", "list", manager.url, "--verify", "--json")
    rows = {row["step"]: row for row in json.loads(out)["checkpoints"]}
    assert code == 0 and rows[1]["status"] == "complete" and rows[2]["status"] == "corrupt"
    assert damaged.name in rows[2]["problem"]
    code, out, _ = _cli(capsys, "checkpoint", "list", manager.url, "--verify")
    assert code == 0 and "corrupt" in out and f"! file://{damaged}" in out


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_verify_exits_2_naming_the_file(run, capsys, kind):
    manager, *_, folder = run
    damaged = DAMAGE[kind](folder)
    code, out, err = _cli(capsys, "checkpoint", "verify", manager.url)
    assert code == 2 and "Traceback" not in err
    assert f"file://{damaged}" in err and "DAMAGED" in out
    if kind == "item":
        assert TENSOR in err and "sha256" in err
    assert _cli(capsys, "checkpoint", "verify", manager.url, "--step", "1")[0] == 0
    assert _cli(capsys, "checkpoint", "verify", f"{manager.url}/step_1")[0] == 0
    code, out, _ = _cli(capsys, "checkpoint", "verify", manager.url, "--all", "--json")
    report = {c["step"]: c for c in json.loads(out)["checkpoints"]}
    assert code == 2 and report[1]["ok"] and not report[2]["ok"]
    assert report[1]["items"] > 0 and report[1]["bytes_hashed"] > 0


def test_verify_checks_the_parent_bytes_a_step_reads(run, capsys):
    manager, *_, folder = run
    damaged = flip_item(folder, FROZEN, step=2)  # the record of step 2 points into step_1's file
    assert damaged.parent.parent.name == "step_1"
    for step in (1, 2):
        code, _, err = _cli(capsys, "checkpoint", "verify", manager.url, "--step", str(step))
        assert code == 2 and FROZEN in err and "step_1/dcp/rank-00000.distcp" in err


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_recover_falls_back_to_the_newest_intact_checkpoint(run, toy_engine, make_manager, file_url, caplog, kind):
    _, _, step1, _, folder = run
    damaged = DAMAGE[kind](folder)
    fresh = toy_engine(seed=9)
    resumer = make_manager(file_url, keep_last=5)
    with caplog.at_level(logging.WARNING, logger="areal_tasks.checkpoint"):
        state = resumer.recover("auto", {"actor": fresh})
    assert state.step == 1 and fresh.get_version() == 1
    for name, tensor in step1.items():
        assert torch.equal(fresh.params()[name], tensor), name
    log = caplog.text
    assert "fails verification" in log and damaged.name in log and "falling back to step_1" in log
    assert "resumed from" in log and "step_1" in log
    assert (folder / "step_2" / QUARANTINE_MARKER).is_file() and not (folder / "step_2" / COMPLETE_MARKER).exists()
    assert {i.step: i.status for i in resumer.list()} == {1: "complete", 2: "quarantined"}
    assert resumer.latest() == 1
    _save(fresh, resumer, 2)  # training goes on: the quarantined directory is replaced
    again = toy_engine(seed=3)
    assert make_manager(file_url, keep_last=5).recover("auto", {"actor": again}).step == 2
    assert {i.step: i.status for i in resumer.list(deep=True)} == {1: "complete", 2: "complete"}


def test_recover_never_starts_fresh_when_every_checkpoint_is_damaged(run, toy_engine, make_manager, file_url):
    manager, *_, folder = run
    flip_item(folder, FROZEN, step=2)  # step_1's bytes, read by both checkpoints
    with pytest.raises(CheckpointError, match="no intact checkpoint") as info:
        make_manager(file_url).recover("auto", {"actor": toy_engine(seed=9)})
    assert FROZEN in str(info.value) and "step_2" in str(info.value) and "step_1" in str(info.value)
    assert {i.status for i in manager.list()} == {"quarantined"}


def test_recover_verify_off_loads_the_flipped_bytes(run, toy_engine, make_manager, file_url):
    """``recover.verify: false`` skips the hash checks (the cost, or a checkpoint edited on purpose)."""
    *_, step2, folder = run
    flip_item(folder)
    fresh = toy_engine(seed=9)
    resumer = make_manager(file_url)
    resumer.verify = False
    assert resumer.recover("auto", {"actor": fresh}).step == 2
    assert not torch.equal(fresh.params()["1.weight"], step2["1.weight"]), "the damaged bytes were loaded"


def test_recover_verify_comes_from_the_job_config(tmp_path):
    from areal_tasks.checkpoint.manager import CheckpointManager
    from areal_tasks.config.job import JobConfig

    job = JobConfig()
    job.storage.url = f"file://{tmp_path}/store"
    assert CheckpointManager.from_config(job).verify is True
    job.recover.verify = False
    assert CheckpointManager.from_config(job).verify is False


def test_json_state_is_checked_before_it_is_applied(run, toy_engine, make_manager, file_url):
    *_, folder = run
    damage.edit_engines(folder)
    fresh = toy_engine(seed=9)
    before = fresh.params()
    with pytest.raises(CheckpointIntegrityError, match="engines.json") as info:
        make_manager(file_url).load(2, {"actor": fresh})
    assert info.value.file.endswith("step_2/engines.json")
    assert fresh.get_version() == 0, "nothing of a damaged checkpoint is applied"
    for name, tensor in before.items():
        assert torch.equal(fresh.params()[name], tensor), name


def test_item_hashes_are_computed_off_the_main_thread(run, toy_engine, make_manager, file_url, monkeypatch):
    from areal_tasks.checkpoint import dcp_read

    threads = []
    real = dcp_read.item_digests
    monkeypatch.setattr(dcp_read, "item_digests", lambda *a: threads.append(threading.current_thread()) or real(*a))
    make_manager(file_url).load(2, {"actor": toy_engine(seed=9)})
    assert threads and threading.main_thread() not in threads


def test_a_garbled_old_step_does_not_break_later_saves(run, make_manager, file_url, caplog):
    """Surprise 1 of the design: pruning read every step's metadata, so one garbled old step made
    every later save raise (after writing it) and a retried job crash-loop."""
    _, engine, *_, folder = run
    (folder / "step_1/metadata.json").write_text("{garbled")
    manager = make_manager(file_url, keep_last=1)  # the retried job: a new process
    with caplog.at_level(logging.WARNING, logger="areal_tasks.checkpoint"):
        _save(engine, manager, 3)
        _save(engine, manager, 4)
    assert "pruning leaves" in caplog.text and "step_1/metadata.json" in caplog.text
    statuses = {i.step: i.status for i in manager.list()}
    assert statuses == {1: "corrupt", 4: "complete"}, "the garbled step is left for inspection, the rest pruned"


@pytest.mark.parametrize("content", ["nested", "huge"])
def test_pathological_metadata_is_a_clear_error(run, capsys, content):
    manager, *_, folder = run
    path = folder / "step_2/metadata.json"
    if content == "nested":
        path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        path.write_bytes(b" " * (17 * 2**20))
    infos = {i.step: i for i in manager.list()}
    assert infos[1].status == "complete" and infos[2].status == "corrupt" and "metadata.json" in infos[2].problem
    for argv in (["inspect", manager.url], ["verify", manager.url], ["export", manager.url, "--hf", "/nonexistent/x"]):
        code, _, err = _cli(capsys, "checkpoint", *argv)
        assert code == 2 and "step_2/metadata.json" in err and "Traceback" not in err, argv


@pytest.mark.parametrize("broken", ["no_state_dict", "item_without_sha", "item_bad_sha", "item_outside"])
def test_an_index_missing_keys_is_a_clear_error(run, capsys, toy_engine, make_manager, file_url, broken):
    manager, *_, folder = run
    index = json.loads((folder / "step_2/dcp/index.json").read_text())
    if broken == "no_state_dict":
        del index["state_dict"]
        expected = "lacks the keys ['state_dict']"
    elif broken == "item_without_sha":
        del index["items"][0]["sha256"]
        expected = "lacks the keys ['sha256']"
    elif broken == "item_bad_sha":
        index["items"][0]["sha256"] = "not hex"
        expected = "not 64 hex digits"
    else:
        index["items"][0]["file"] = "../../../../etc/passwd"
        expected = "outside the checkpoints folder"
    rewrite_index_consistently(folder, 2, index)
    code, _, err = _cli(capsys, "checkpoint", "verify", manager.url)
    assert code == 2 and "step_2/dcp/index.json" in err and expected in err and "Traceback" not in err
    with pytest.raises(CheckpointIntegrityError, match="index.json"):
        make_manager(file_url).load(2, {"actor": toy_engine(seed=9)})


def test_list_of_a_missing_folder_exits_2(tmp_path, capsys):
    for command in ("list", "verify", "inspect"):
        code, out, err = _cli(capsys, "checkpoint", command, f"file://{tmp_path}/nothing-here")
        assert code == 2 and "no checkpoints folder" in err and "nothing-here" in err and out == "", command
