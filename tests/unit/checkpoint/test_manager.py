"""CheckpointManager in one process (toy engine): exact resume, crash-safety rules, recover modes,
refusal to overwrite, incremental references and pruning that keeps referenced data."""

from __future__ import annotations

import json

import pytest
import torch

from areal_tasks.checkpoint.layout import COMPLETE_MARKER, LATEST_POINTER
from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.errors import CheckpointError


def _run(engine, manager, steps, *, save_every=1, metrics=None):
    losses = []
    for step in steps:
        losses.append(engine.train_step())
        if step % save_every == 0:
            state = TrainerState(
                step=step,
                epoch=step // 3,
                version=engine.get_version(),
                dataloader={"index": step * 16},
                executor={"stale": [step, 0]},
            )
            manager.save(step, {"actor": engine}, state, (metrics or {}).get(step, {"loss": losses[-1]})).wait()
    return losses


def test_resume_is_bit_identical(storage_url, toy_engine, make_manager):
    straight = toy_engine(seed=0)
    expected = _run(straight, make_manager(storage_url, keep_last=10), range(1, 7), save_every=3)
    expected_params = straight.params()

    first = toy_engine(seed=0)
    manager = make_manager(
        storage_url.replace("store", "store2") if "store" in storage_url else storage_url + "-2", keep_last=10
    )
    got = _run(first, manager, range(1, 4), save_every=3)
    resumed = toy_engine(seed=123)  # different init and RNG: everything must come from the checkpoint
    state = manager.recover("auto", {"actor": resumed})
    assert state == TrainerState(step=3, epoch=1, version=3, dataloader={"index": 48}, executor={"stale": [3, 0]})
    got += _run(resumed, manager, range(4, 7), save_every=3)
    assert got == expected
    for name, tensor in expected_params.items():
        assert torch.equal(tensor, resumed.params()[name]), name
    assert resumed.lr_scheduler.get_last_lr() == straight.lr_scheduler.get_last_lr()
    assert resumed.get_version() == 6
    s_opt, r_opt = straight.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    for key in s_opt:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s_opt[key][field], r_opt[key][field])


def test_partial_save_is_ignored_and_removed_by_next_prune(file_url, toy_engine, make_manager, monkeypatch):
    engine = toy_engine()
    manager = make_manager(file_url, keep_last=5)
    _run(engine, manager, [1])
    engine.train_step()

    import areal_tasks.checkpoint.save as save_mod

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("simulated kill before the commit")

    monkeypatch.setattr(save_mod, "_commit", killed)
    with pytest.raises(KeyboardInterrupt):
        manager.save(2, {"actor": engine}, TrainerState(step=2), {})
    monkeypatch.undo()

    storage = manager.layout.storage
    assert storage.exists("step_2/dcp/rank-00000.distcp") and not storage.exists(f"step_2/{COMPLETE_MARKER}")
    reader = make_manager(file_url, keep_last=5)
    assert reader.latest() == 1
    assert [(i.step, i.status) for i in reader.list()] == [(1, "complete"), (2, "partial")]
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        reader.load(2, {"actor": toy_engine()})
    assert reader.recover("auto", {"actor": toy_engine()}).step == 1
    plan = reader.prune()
    assert plan.delete == ["step_2"] and not storage.exists("step_2")


def test_resaving_a_step_clears_its_partial_leftover(file_url, toy_engine, make_manager):
    engine = toy_engine()
    manager = make_manager(file_url)
    storage = manager.layout.storage
    storage.write_bytes("step_1/dcp/rank-00000.distcp", b"garbage from a killed save")
    _run(engine, manager, [1])
    assert manager.latest() == 1
    fresh = toy_engine(seed=9)
    manager.load(1, {"actor": fresh})
    assert all(torch.equal(v, engine.params()[k]) for k, v in fresh.params().items())


def test_complete_checkpoints_are_never_overwritten(file_url, toy_engine, make_manager):
    engine = toy_engine()
    manager = make_manager(file_url)
    _run(engine, manager, [1])
    with pytest.raises(CheckpointError, match="never overwritten"):
        manager.save(1, {"actor": engine}, TrainerState(step=1), {})
    with pytest.raises(CheckpointError, match="differs from the step"):
        manager.save(2, {"actor": engine}, TrainerState(step=3), {})


def test_recover_modes(file_url, toy_engine, make_manager):
    manager = make_manager(file_url)
    engine = toy_engine()
    assert manager.recover("auto", {"actor": engine}) is None
    with pytest.raises(CheckpointError, match="resume"):
        manager.recover("resume", {"actor": engine})
    with pytest.raises(CheckpointError, match="recover.mode"):
        manager.recover("sometimes", {"actor": engine})
    _run(engine, manager, [1])
    assert manager.recover("disabled", {"actor": engine}) is None
    assert manager.recover("resume", {"actor": toy_engine()}).step == 1


def test_latest_prefers_the_newest_complete_checkpoint_over_a_stale_pointer(file_url, toy_engine, make_manager):
    engine = toy_engine()
    manager = make_manager(file_url, keep_last=5)
    _run(engine, manager, [1, 2])
    storage = manager.layout.storage
    storage.write_text(LATEST_POINTER, json.dumps({"step": 1}))  # killed between _COMPLETE and the pointer
    assert manager.latest() == 2
    storage.delete(LATEST_POINTER)
    assert manager.latest() == 2
    storage.delete(f"step_2/{COMPLETE_MARKER}")
    storage.write_text(LATEST_POINTER, json.dumps({"step": 2}))  # a pointer to an incomplete directory
    assert manager.latest() == 1


def test_incremental_references_frozen_weights_and_prune_keeps_them(storage_url, toy_engine, make_manager):
    engine = toy_engine()
    manager = make_manager(storage_url, keep_last=1)
    _run(engine, manager, [1, 2, 3])
    first, second = manager.list()[0], manager.list()[-1]
    assert first.status == "data" and second.status == "complete"
    meta = second.metadata
    embedding_bytes = engine.model[0].weight.numel() * 4
    assert meta.parent == 2 and meta.references == {"step_1": ["dcp/rank-00000.distcp"]}
    assert meta.sizes.referenced >= embedding_bytes
    data_size = meta.files["dcp/rank-00000.distcp"].size
    n_items = len(json.loads(manager.layout.storage.read_text("step_3/dcp/index.json"))["items"])
    assert (
        meta.sizes.logical - meta.sizes.referenced
        <= data_size
        < meta.sizes.logical - meta.sizes.referenced + 64 * n_items
    )
    # step_2 referenced nothing of its own that step_3 reuses beyond step_1's data: it is gone
    assert [i.dir for i in manager.list()] == ["step_1", "step_3"]
    assert not manager.layout.storage.exists(f"step_1/{COMPLETE_MARKER}")
    fresh = toy_engine(seed=7)
    manager.load(3, {"actor": fresh})
    assert all(torch.equal(v, engine.params()[k]) for k, v in fresh.params().items())


def test_full_saves_write_everything(file_url, toy_engine, make_manager):
    engine = toy_engine()
    manager = make_manager(file_url, incremental=False, keep_last=1)
    _run(engine, manager, [1, 2])
    meta = manager.metadata(2)
    assert meta.parent is None and meta.references == {} and meta.sizes.referenced == 0
    assert [i.dir for i in manager.list()] == ["step_2"]


def test_retention_keeps_last_every_and_best(file_url, toy_engine, make_manager):
    engine = toy_engine()
    manager = make_manager(file_url, incremental=False, keep_last=2, keep_every=3, keep_best_metric="reward")
    rewards = {1: 0.1, 2: 0.9, 3: 0.2, 4: 0.3, 5: 0.4, 6: 0.5, 7: 0.6, 8: 0.7}
    _run(engine, manager, range(1, 9), metrics={s: {"reward": r} for s, r in rewards.items()})
    assert [i.step for i in manager.list()] == [2, 3, 6, 7, 8]
    assert all(i.complete for i in manager.list())


def test_verified_load_detects_corruption(file_url, toy_engine, make_manager, tmp_path):
    from areal_tasks.checkpoint.dcp_read import StorageDCPReader, dcp_load
    from areal_tasks.checkpoint.state import sharded_state_dict

    engine = toy_engine()
    manager = make_manager(file_url)
    _run(engine, manager, [1])
    path = tmp_path / "store/exp/trial/checkpoints/step_1/dcp/rank-00000.distcp"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        dcp_load(
            sharded_state_dict({"actor": engine}),
            StorageDCPReader(manager.layout.storage, "step_1", verify=True),
            None,
            False,
        )


def test_saving_before_the_first_step_changes_nothing(file_url, toy_engine, make_manager):
    straight = toy_engine(seed=0)
    expected = [straight.train_step() for _ in range(2)]
    engine = toy_engine(seed=0)
    manager = make_manager(file_url)
    manager.save(0, {"actor": engine}, TrainerState(step=0), {}).wait()
    assert not engine.optimizer.state
    assert [engine.train_step() for _ in range(2)] == expected
    resumed = toy_engine(seed=3)
    manager.load(0, {"actor": resumed})  # restores the RNGs of the save, and no optimizer state
    assert not resumed.optimizer.state
    assert [resumed.train_step() for _ in range(2)] == expected
