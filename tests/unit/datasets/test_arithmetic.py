"""The arithmetic demo task: deterministic seeded generation, disjoint splits, options and the registry."""

from __future__ import annotations

import json

import pytest

from areal_tasks.config.sections import ColumnsConfig, DatasetConfig
from areal_tasks.datasets import ArithmeticOptions, generate_splits, load_records
from areal_tasks.datasets.registry import arithmetic_options, load_split
from areal_tasks.errors import ConfigError


def test_same_seed_same_problems_other_seed_differs() -> None:
    opts = ArithmeticOptions(digits=2, n_train=50, n_eval=10, seed=3)
    assert generate_splits(opts) == generate_splits(ArithmeticOptions(digits=2, n_train=50, n_eval=10, seed=3))
    assert generate_splits(opts) != generate_splits(ArithmeticOptions(digits=2, n_train=50, n_eval=10, seed=4))


@pytest.mark.parametrize("digits", [1, 2, 5])
def test_splits_are_disjoint_distinct_and_sized(digits: int) -> None:
    n_train, n_eval = (150, 40) if digits == 1 else (300, 60)
    train, evaluation = generate_splits(ArithmeticOptions(digits=digits, n_train=n_train, n_eval=n_eval))
    assert len(train) == n_train and len(evaluation) == n_eval
    assert len(set(train)) == n_train and not set(train) & set(evaluation)
    assert all(0 <= p.left < 10**digits and 0 <= p.right < 10**digits for p in train + evaluation)


def test_answers_and_question_text() -> None:
    train, _ = generate_splits(ArithmeticOptions(digits=2, n_train=200, n_eval=0, ops="+-"))
    assert {p.op for p in train} == {"+", "-"}
    for p in train:
        assert p.answer == (p.left + p.right if p.op == "+" else p.left - p.right)
        assert p.question == f"What is {p.left} {p.op} {p.right}?"


def test_too_many_problems_and_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="exceeds the 100 distinct"):
        ArithmeticOptions(digits=1, ops="+", n_train=95, n_eval=10)
    with pytest.raises(ConfigError, match="ops"):
        ArithmeticOptions(ops="*")
    with pytest.raises(ConfigError, match="wrong_fraction"):
        ArithmeticOptions(wrong_fraction=1.5)


def test_demo_spec_options_including_plus_sign() -> None:
    opts = arithmetic_options("demo:arithmetic?digits=2&ops=+&n_train=30&n_eval=5&wrong_fraction=0.5")
    assert opts == ArithmeticOptions(digits=2, ops="+", n_train=30, n_eval=5, wrong_fraction=0.5)
    records = load_records("demo:arithmetic?digits=2&ops=+&n_train=30&n_eval=5", "eval")
    assert len(records) == 5 and all("+" in r.prompt for r in records)
    with pytest.raises(ConfigError, match="unknown option 'size'"):
        arithmetic_options("demo:arithmetic?size=3")
    with pytest.raises(ConfigError, match="unknown demo task"):
        load_records("demo:algebra")


def test_jsonl_records_and_eval_path_rule(tmp_path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"What is {i} + 1?", "a": i + 1}) for i in range(3)) + "\n")
    columns = ColumnsConfig(prompt="q", answer="a")
    records = load_records(str(path), columns=columns)
    assert [r.answer for r in records] == ["1", "2", "3"]
    with pytest.raises(ConfigError, match=r"data.jsonl: no column for dataset.columns.prompt='prompt'"):
        load_records(str(path))
    cfg = DatasetConfig(path=str(path), columns=columns)
    with pytest.raises(ConfigError, match="eval_path is not set"):
        load_split(cfg, "eval")
    cfg_eval = DatasetConfig(path="demo:arithmetic", eval_path=str(path), columns=columns)
    assert load_split(cfg_eval, "eval") == records


def test_the_larger_of_two_numbers() -> None:
    train, evaluation = generate_splits(ArithmeticOptions(digits=2, ops=">", n_train=50, n_eval=10))
    for problem in train + evaluation:
        assert problem.question == f"Which is larger, {problem.left} or {problem.right}?"
        assert problem.answer == max(problem.left, problem.right)
    records = load_records("demo:arithmetic?digits=1&ops=+>&n_train=20&n_eval=5", "train")
    assert any(r.prompt.startswith("Which is larger") for r in records) and any("+" in r.prompt for r in records)
