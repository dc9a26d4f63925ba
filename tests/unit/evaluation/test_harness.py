"""The evaluation harness through a scripted inference engine: its figures equal a hand computation
on eval sets whose completions are known (the job's real workflow, chat template and reward
worker), the JSON summary has exactly the documented keys, the per-item JSONL has one line per item,
several sets give per-set objects plus the pooled overall, and bad inputs fail before any server
with a message saying what to fix (exit code 2 from ``areal eval``)."""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import pytest

from areal_tasks.cli import main
from areal_tasks.config import load_config
from areal_tasks.errors import EvaluationError
from areal_tasks.evaluation import EvalOptions, sample_and_score, write_run
from areal_tasks.evaluation.extractors import FALLBACK, extractor_for
from areal_tasks.evaluation.report import build_run, items_path_for
from areal_tasks.evaluation.sets import default_name, load_sets, parse_set_arg
from tests.unit.evaluation.scripted import ScriptedEngine

#: question -> (reference answer, the 4 scripted completions)
FIRST = {
    "Which is larger, 3 or 7?": ("7", ["Answer: 7", "Answer: 3", "Answer: 7", "no idea"]),
    "Which is larger, 9 or 2?": ("9", ["Answer: 2", "Answer: 2", "Answer: 9", "Answer: 9"]),
    "Which is larger, 5 or 6?": ("6", ["foo", "bar", "Answer: 6", "baz"]),
}
SECOND = {"Which is larger, 4 or 1?": ("4", ["Answer: 4", "Answer: 4", "Answer: 1", "Answer: 4"])}
SUMMARY_KEYS = {"pass@1", "pass@2", "maj@2", "answer_rate", "mean_response_length", "n_items", "n_samples"}


def _write(path: Path, items: dict[str, tuple[str, list[str]]]) -> str:
    path.write_text("".join(json.dumps({"prompt": q, "answer": a}) + "\n" for q, (a, _) in items.items()))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen2: Path):
    from areal_tasks.models.tokenizer import load_tokenizer

    return load_tokenizer(str(tiny_qwen2))


def _run(tmp_path: Path, tokenizer, sets_spec: list[str], script: dict, **options):
    cfg = load_config(None, [f"experiment.run_dir={tmp_path}"])
    # one episode at a time: each prompt's samples reach the engine in sample order
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_concurrent_rollouts=1))
    opts = EvalOptions(**{"n_samples": 4, "k": 2, "temperature": 1.0, **options}).resolve(cfg)
    sets = load_sets(cfg, sets_spec)
    engine = ScriptedEngine(tokenizer, {q: c for q, (_, c) in script.items()})
    outcomes = sample_and_score(engine, tokenizer, cfg, sets, opts, progress=False)
    assert engine.closed
    return build_run(outcomes, opts, {"model": "scripted", "wall_s": 0.0}), engine


def test_figures_equal_a_hand_computation(tmp_path: Path, tokenizer) -> None:
    """Item by item (n=4, k=2; arithmetic reward, correct = reward 1):

    7: c=2 -> pass@1 1/2, pass@2 1 - C(2,2)/C(4,2) = 5/6; first two vote 7 vs 3, tie -> 7 (first seen), right -> 1
    9: c=2 -> 1/2, 5/6; first two vote 2, 2 -> wrong -> 0
    6: c=1 -> 1/4, 1 - C(3,2)/C(4,2) = 1/2; first two give no answer -> 0
    answers: 3 + 4 + 1 of 12 samples; reward: 5 of 12.
    """
    run, engine = _run(tmp_path, tokenizer, [_write(tmp_path / "first.jsonl", FIRST)], FIRST)
    s = run.summary
    assert s["pass@1"] == pytest.approx(float((Fraction(1, 2) + Fraction(1, 2) + Fraction(1, 4)) / 3))
    assert s["pass@2"] == pytest.approx(float((Fraction(5, 6) + Fraction(5, 6) + Fraction(1, 2)) / 3))
    assert s["maj@2"] == pytest.approx(1 / 3)
    assert s["answer_rate"] == pytest.approx(8 / 12)
    assert s["mean_reward"] == pytest.approx(5 / 12)
    assert s["mean_response_length"] == pytest.approx(sum(engine.sent) / 12) and s["length_unit"] == "tokens"
    assert (s["n_items"], s["n_samples"], s["k"], s["samples_per_item"]) == (3, 12, 2, 4)
    assert set(s) >= SUMMARY_KEYS and "sets" not in s
    assert (s["reward"], s["extractor"], s["temperature"], s["data"]) == (
        "arithmetic",
        "arithmetic",
        1.0,
        str(tmp_path / "first.jsonl"),
    )

    by_prompt = {item["prompt"]: item for item in run.items}
    seven = by_prompt["Which is larger, 3 or 7?"]
    assert seven["answers"] == ["7", "3", "7", None] and seven["correct"] == [True, False, True, False]
    assert seven["voted_answer"] == "7" and seven["maj@2"] == 1 and seven["completions"][3] == "no idea"
    assert seven["set"] == "first" and seven["item_id"] == "first/0" and seven["rewards"] == [1.0, 0.0, 1.0, 0.0]

    out = tmp_path / "res.json"
    write_run(run, out, items_path_for(out))
    assert json.loads(out.read_text()) == s
    lines = (tmp_path / "res.items.jsonl").read_text().splitlines()
    assert len(lines) == 3 and {json.loads(line)["item_id"] for line in lines} == {"first/0", "first/1", "first/2"}


def test_several_sets_give_per_set_objects_and_the_pooled_overall(tmp_path: Path, tokenizer) -> None:
    first, second = _write(tmp_path / "first.jsonl", FIRST), _write(tmp_path / "second.jsonl", SECOND)
    run, _ = _run(tmp_path, tokenizer, [first, f"extra={second}"], {**FIRST, **SECOND})
    s = run.summary
    assert set(s["sets"]) == {"first", "extra"} and s["data"] == [first, second]
    # the extra item: c=3 -> pass@1 3/4, pass@2 1; votes 4, 4 -> right
    assert s["sets"]["extra"]["pass@1"] == pytest.approx(0.75) and s["sets"]["extra"]["maj@2"] == 1.0
    assert s["sets"]["first"]["pass@1"] == pytest.approx(1.25 / 3)
    # pooled: every item of every set counts once
    assert s["pass@1"] == pytest.approx((1.25 + 0.75) / 4)
    assert s["maj@2"] == pytest.approx(2 / 4) and s["answer_rate"] == pytest.approx(12 / 16)
    assert s["n_items"] == 4 and s["n_samples"] == 16 and set(s["sets"]["extra"]) >= SUMMARY_KEYS
    assert len(run.items) == 4


def test_extractors_follow_the_reward() -> None:
    assert extractor_for("arithmetic").extract("so Answer: 12") == "12"
    assert extractor_for("gsm8k").extract("... #### 1,000") == extractor_for("numeric").extract("Answer: 1000")
    math = extractor_for("math")
    assert math is extractor_for("math_verify")
    assert math.vote_key(math.extract(r"so \boxed{\frac{1}{2}}")) == math.vote_key(math.extract("Answer: 1/2"))
    code = extractor_for("code_tests")
    assert code.extract("here:\n```python\nprint(1)\n```") == "print(1)" and code.extract("print(1)") is None
    assert extractor_for("exact_match").extract("  yes ") == "yes"
    assert extractor_for("areal_tasks.rollout.rewards.builtin:arithmetic").name == "arithmetic"
    assert extractor_for("areal_tasks.datasets.reward:arithmetic_reward") is FALLBACK
    assert FALLBACK.extract("work\n\n 42 \n") == "42" and FALLBACK.extract(" \n") is None


def test_set_names() -> None:
    assert default_name("/data/gsm8k_test.jsonl") == "gsm8k_test"
    assert default_name("demo:arithmetic?digits=2&n_eval=5") == "arithmetic"
    assert default_name("s3://bucket/evals/math500.parquet") == "math500"
    assert parse_set_arg("gsm=/d/x.jsonl") == ("gsm", "/d/x.jsonl")
    assert parse_set_arg("demo:arithmetic?digits=2") == (None, "demo:arithmetic?digits=2")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "{tmp}/nope"], "model directory .*nope.* does not exist"),
        (["--model", "{tmp}"], "has no config.json"),
        (["--model", "{model}", "--data", "{tmp}/missing.jsonl"], "eval set 'missing' .* cannot be read"),
        (["--model", "{model}", "--reward", "no_such_reward"], "unknown reward 'no_such_reward'; registered rewards"),
        (["--model", "{model}", "--n-samples", "2", "--k", "3"], "k=3 is larger than n_samples=2.*--n-samples"),
        (["--model", "{model}", "--n-samples", "0"], "n_samples=0 must be an integer >= 1"),
        (["--model", "{model}", "--temperature", "-1"], "temperature=-1.0 must be >= 0"),
        (["--model", "{model}", "--max-items", "0"], "max_items=0 must be >= 1"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(tmp_path: Path, tiny_qwen2: Path, capsys, args, message) -> None:
    import re

    argv = ["eval", *(a.format(tmp=tmp_path, model=tiny_qwen2) for a in args), f"experiment.run_dir={tmp_path}/run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_options_resolve_from_the_config() -> None:
    cfg = load_config("configs/demo_grpo.yaml")
    opts = EvalOptions(n_samples=3).resolve(cfg)
    assert (opts.k, opts.temperature, opts.reward) == (3, cfg.evaluation.temperature, cfg.rollout.reward.fn)
    with pytest.raises(EvaluationError, match="k=4 is larger"):
        EvalOptions(n_samples=3, k=4).resolve(cfg)


def test_model_may_be_a_tiny_kit_spec_or_a_hub_id() -> None:
    """Like ``model.path``: ``tiny:<family>`` is accepted; a hub id is resolved through the hub, and one the
    hub cannot serve (offline here) is an EvaluationError naming the id."""
    from areal_tasks.evaluation.harness import check_model_dir

    check_model_dir("tiny:qwen2")
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:  # offline: fail fast rather than retry a dead network
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        with pytest.raises(EvaluationError, match=r"--model 'no-such-org/no-such-model'"):
            check_model_dir("no-such-org/no-such-model")
