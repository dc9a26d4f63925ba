"""The recipe fixture data: the committed sample (examples/recipes/) is what the generator writes,
and its references are consistent (GSM8K solutions' calculator annotations are right and end in
``#### N``; each coding problem's tests call its function and pass with its reference solution)."""

from __future__ import annotations

from pathlib import Path

from areal_tasks.datasets.math_answers import extract_gsm8k_answer
from areal_tasks.datasets.registry import load_records
from areal_tasks.rollout.rewards import gsm8k
from tests.fixtures.recipe_data import FILES, code_items, gsm8k_items, write_recipe_data


def test_committed_sample_matches_the_generator(repo_root: Path, tmp_path: Path) -> None:
    written = write_recipe_data(tmp_path)
    assert sorted(written) == sorted(FILES)
    for name, path in written.items():
        committed = repo_root / "examples" / "recipes" / name
        assert committed.read_text() == path.read_text(), f"regenerate: python tests/fixtures/recipe_data.py ({name})"
        assert load_records(str(committed))  # the data loader reads it (prompt / answer keys)


def test_gsm8k_items_are_consistent() -> None:
    items = gsm8k_items(32, seed=1)
    assert len({item["prompt"] for item in items}) == 32
    for item in items:
        final = extract_gsm8k_answer(item["answer"])
        assert final is not None and item["answer"].endswith(f"#### {final}")
        # every calculator annotation <<expression=result>> is right
        for annotation in item["answer"].split("<<")[1:]:
            expression, result = annotation.split(">>", 1)[0].split("=")
            assert eval(expression) == float(result)  # our own generated arithmetic
        assert gsm8k(f"#### {final}", item["answer"]) == 1.0
        assert gsm8k(f"#### {int(final) + 1}", item["answer"]) == 0.0


def test_code_items_have_tests_for_their_function() -> None:
    items = code_items(16, seed=1)
    for item in items:
        assert item["answer"].startswith(f"assert {item['entry_point']}(")
        assert f"def {item['entry_point']}(" in item["solution"]
        namespace: dict = {}
        exec(item["solution"], namespace)  # our own reference solutions
        exec(item["answer"], namespace)  # its tests pass (the sandbox: tests/integration/recipes)
