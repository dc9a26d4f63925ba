"""``areal checkpoint export --hf OUT`` never destroys and never ships damage (issue #26, items 1 and 2).

Before: an OUT holding the user's files was replaced (the files deleted); a file as OUT was hidden as
``.OUT.old-*`` and a traceback left a staging directory; a damaged checkpoint exported with exit 0;
an index without ``state_dict`` gave ``KeyError``. Now: OUT must be new or empty; ``--force`` writes
into it, replacing only what an earlier export wrote (its ``.areal-written.json``) and never a file
it did not write; a file is refused; nothing is left beside OUT on any error; every exported byte is
checked first. The checkpoint: two steps of the tiny qwen2 through ``test_export_cli``'s HF engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from areal_tasks.checkpoint.state import TrainerState
from areal_tasks.cli import main
from storage.ownership import MANIFEST
from tests.unit.checkpoint import damage
from tests.unit.checkpoint.test_export_cli import HFEngine

HF_FILES = {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}


@pytest.fixture
def saved(tiny_qwen2, file_url, make_manager, tmp_path):
    """(engine, manager, checkpoints folder) with steps 1 and 2 saved."""
    engine = HFEngine(tiny_qwen2)
    manager = make_manager(file_url)
    for step in (1, 2):
        engine.step()
        manager.save(step, {"actor": engine}, TrainerState(step=step), {"loss": 1.0 / step}).wait()
    return engine, manager, tmp_path / "store/exp/trial/checkpoints"


def _export(capsys, manager, out: Path, *extra: str) -> tuple[int, str]:
    code = main(["checkpoint", "export", manager.url, "--hf", str(out), *extra])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, captured.err


def _names(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def _loads_as_the_engine(engine, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    expected = engine.model.state_dict()
    for name, tensor in exported.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


def test_a_directory_with_user_files_is_refused_untouched(saved, capsys, tmp_path):
    _, manager, _ = saved
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("precious")
    code, err = _export(capsys, manager, out)
    assert code == 2 and "not empty" in err and "--force" in err
    assert _names(out) == {"mine.txt"} and (out / "mine.txt").read_text() == "precious"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")], "no staging or .old sibling"


def test_force_writes_beside_user_files_and_keeps_them(saved, capsys, tmp_path):
    engine, manager, _ = saved
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("precious")
    code, _ = _export(capsys, manager, out, "--force")
    assert code == 0
    assert (out / "mine.txt").read_text() == "precious"
    assert _names(out) >= HF_FILES
    assert "mine.txt" not in json.loads((out / MANIFEST).read_text())["files"]
    _loads_as_the_engine(engine, out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_force_replaces_only_what_an_earlier_export_wrote(saved, capsys, tmp_path):
    engine, manager, _ = saved
    out = tmp_path / "out"
    assert _export(capsys, manager, out, "--step", "1")[0] == 0
    code, err = _export(capsys, manager, out)
    assert code == 2 and "not empty" in err, "an earlier export is not replaced without --force"
    # an earlier export wrote a shard this one does not write, and the user added notes
    (out / "model-00002-of-00002.safetensors").write_bytes(b"stale")
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"].append("model-00002-of-00002.safetensors")
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "notes.md").write_text("precious")
    code, _ = _export(capsys, manager, out, "--force")
    assert code == 0
    assert not (out / "model-00002-of-00002.safetensors").exists(), "the stale shard of the earlier export goes"
    assert (out / "notes.md").read_text() == "precious"
    _loads_as_the_engine(engine, out)  # step 2's weights, not step 1's


def test_force_never_overwrites_a_file_it_did_not_write(saved, capsys, tmp_path):
    _, manager, _ = saved
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    code, err = _export(capsys, manager, out, "--force")
    assert code == 2 and "config.json" in err
    assert _names(out) == {"config.json"} and (out / "config.json").read_text() == '{"mine": true}'
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


@pytest.mark.parametrize("force", [False, True])
def test_a_file_target_is_refused_and_left_alone(saved, capsys, tmp_path, force):
    _, manager, _ = saved
    out = tmp_path / "out"
    out.write_text("precious")
    code, err = _export(capsys, manager, out, *(["--force"] if force else []))
    assert code == 2 and "not a directory" in err
    assert out.read_text() == "precious"
    assert _names(tmp_path) - {"store"} == {"out"}, "no staging or .old sibling"


def test_an_empty_directory_and_a_parent_that_is_a_file(saved, capsys, tmp_path):
    engine, manager, _ = saved
    (tmp_path / "empty").mkdir()
    assert _export(capsys, manager, tmp_path / "empty")[0] == 0
    _loads_as_the_engine(engine, tmp_path / "empty")
    (tmp_path / "afile").write_text("x")
    code, err = _export(capsys, manager, tmp_path / "afile" / "out")
    assert code == 2 and "afile" in err and (tmp_path / "afile").read_text() == "x"


def test_a_damaged_tensor_is_not_exported(saved, capsys, tmp_path):
    _, manager, folder = saved
    damage.flip_item(folder, "engines.actor.model.lm_head.weight", step=2)
    code, err = _export(capsys, manager, tmp_path / "hf")
    assert code == 2 and "engines.actor.model.lm_head.weight" in err and "sha256" in err
    assert not (tmp_path / "hf").exists()
    assert _export(capsys, manager, tmp_path / "hf", "--step", "1")[0] == 0, "an intact step still exports"


@pytest.mark.parametrize("what", ["engines", "sidecar"])
def test_damaged_json_and_sidecar_are_not_exported(saved, capsys, tmp_path, what):
    _, manager, folder = saved
    if what == "engines":
        path = damage.edit_engines(folder)
    else:
        path = folder / "step_2/hf/actor/config.json"
        path.write_text(path.read_text().replace('"vocab_size"', '"vocab_size" ', 1))
    code, err = _export(capsys, manager, tmp_path / "hf")
    assert code == 2 and str(path) in err and not (tmp_path / "hf").exists()


def test_an_index_without_state_dict_is_a_clear_error(saved, capsys, tmp_path):
    """Before: ``KeyError: 'state_dict'`` (exit 1, a traceback)."""
    _, manager, folder = saved
    index = json.loads((folder / "step_2/dcp/index.json").read_text())
    del index["state_dict"]
    damage.rewrite_index_consistently(folder, 2, index)
    code, err = _export(capsys, manager, tmp_path / "hf")
    assert code == 2 and "step_2/dcp/index.json" in err and "state_dict" in err
