"""``base:`` inheritance: chains, relative paths, deep merge, list replacement, cycles, bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_tasks.config import load_config
from areal_tasks.config.inherit import load_tree
from areal_tasks.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_chain_of_three_with_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "root" / "a.yaml", "train: {total_steps: 7, batch_size: 8}\nrollout: {sampling: {stop: [x, y]}}\n")
    write(tmp_path / "root" / "sub" / "b.yaml", "base: ../a.yaml\ntrain: {total_steps: 9}\nexperiment: {name: b}\n")
    child = write(tmp_path / "other" / "c.yaml", "base: ../root/sub/b.yaml\nrollout: {sampling: {stop: [z]}}\n")
    monkeypatch.chdir(tmp_path / "other")  # relative to the file, not to the working directory
    cfg = load_config(child)
    assert cfg.train.total_steps == 9  # b over a
    assert cfg.train.batch_size == 8  # kept from a (deep merge)
    assert cfg.experiment.name == "b"
    assert cfg.rollout.sampling.stop == ["z"]  # lists are replaced, not concatenated
    assert cfg.rollout.group_size == 4  # schema default


def test_null_in_child_replaces_a_section(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "ref: {backend: fsdp}\nalgorithm: {kl_coef: 0.1}\n")
    assert load_config(tmp_path / "a.yaml").ref is not None
    write(tmp_path / "b.yaml", "base: a.yaml\nref: null\nalgorithm: {kl_coef: 0.0}\n")
    assert load_config(tmp_path / "b.yaml").ref is None


def test_cycle_is_detected_and_shown(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: c.yaml\n")
    write(tmp_path / "c.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="inheritance cycle") as info:
        load_config(tmp_path / "a.yaml")
    message = str(info.value)
    assert message.index("a.yaml") < message.index("b.yaml") < message.index("c.yaml")


def test_self_reference_is_a_cycle(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_tree(tmp_path / "a.yaml")


def test_missing_base_names_file_and_looked_up_path(tmp_path: Path) -> None:
    child = write(tmp_path / "dir" / "child.yaml", "base: nope.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_config(child)
    message = str(info.value)
    assert "child.yaml" in message and "'nope.yaml' not found" in message
    assert str(tmp_path / "dir" / "nope.yaml") in message


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("- a\n- b\n", "must be a mapping of sections"),
        ("base: 3\n", "'base' must be a file path"),
        ("train: {batch_size: [\n", "invalid YAML"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        load_config(write(tmp_path / "bad.yaml", text))


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path / "empty.yaml", "")) == load_config()


def test_unknown_key_in_file_names_file_and_suggestion(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "train: {batch_size: 8}\n")
    child = write(tmp_path / "b.yaml", "base: a.yaml\nactor:\n  optimiser: {lr: 1.0e-5}\n")
    with pytest.raises(ConfigError) as info:
        load_config(child)
    message = str(info.value)
    assert "actor.optimiser: unknown key; did you mean actor.optimizer?" in message
    assert "Valid keys at actor: backend, optimizer," in message
    assert f"set in {child}" in message


def test_child_switching_algorithm_starts_section_afresh(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "algorithm: {name: dapo, overlong_buffer_len: 8}\n")
    child = write(tmp_path / "b.yaml", "base: a.yaml\nalgorithm: {name: grpo, eps_clip: 0.1}\n")
    cfg = load_config(child)
    assert cfg.algorithm.name == "grpo"
    assert cfg.algorithm.eps_clip == 0.1
    assert not hasattr(cfg.algorithm, "overlong_buffer_len")


def test_child_keeping_algorithm_merges_knobs(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", "algorithm: {name: dapo, overlong_buffer_len: 8}\n")
    child = write(tmp_path / "b.yaml", "base: a.yaml\nalgorithm: {eps_clip: 0.1}\n")
    cfg = load_config(child)
    assert (cfg.algorithm.name, cfg.algorithm.overlong_buffer_len, cfg.algorithm.eps_clip) == ("dapo", 8, 0.1)
