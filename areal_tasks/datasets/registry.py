"""Resolve a ``dataset.path`` value to records.

Accepted forms:

* ``demo:arithmetic`` with optional options as a query string, e.g.
  ``demo:arithmetic?digits=2&ops=+&n_train=500&n_eval=50&seed=3&wrong_fraction=0.3`` (the fields of
  :class:`~areal_tasks.datasets.arithmetic.ArithmeticOptions`). A demo set has both splits.
* ``demo:calculator`` with the same options (two-digit ``+-`` by default, see
  :class:`~areal_tasks.datasets.calculator.CalculatorOptions`): the same questions, each record
  carrying the calculator's tool schema in ``tools`` (a task for tool-using agents).
* a local ``.jsonl`` file: one JSON object per line holding ``prompt_key`` and ``answer_key``. A
  file has one split; the eval split comes from ``dataset.eval_path``.

:func:`load_split` applies that rule to a ``DatasetConfig``: ``train`` reads ``path``; ``eval`` reads
``eval_path`` when set, else the eval split of a demo ``path``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl

from areal_tasks.datasets import calculator
from areal_tasks.datasets.arithmetic import ArithmeticOptions, generate_splits
from areal_tasks.datasets.prompts import SYSTEM_PROMPT
from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.config.sections import DatasetConfig

logger = logging.getLogger(__name__)

Split = Literal["train", "eval"]
DEMO_PREFIX = "demo:"
#: each demo task's options type (its fields are the spec's query keys).
DEMO_OPTIONS: dict[str, type[ArithmeticOptions]] = {
    "arithmetic": ArithmeticOptions,
    "calculator": calculator.CalculatorOptions,
}
DEMO_TASKS = tuple(DEMO_OPTIONS)


@dataclass(frozen=True)
class Record:
    """One prompt and its reference answer (kept as text; rewards parse it); ``tools``: the OpenAI
    tool schemas an agent offers for it (empty for plain prompts)."""

    prompt: str
    answer: str
    tools: tuple[dict[str, Any], ...] = ()


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"demo:arithmetic?digits=2"`` -> ``("arithmetic", {"digits": "2"})``; ConfigError for other forms."""
    if not spec.startswith(DEMO_PREFIX):
        raise ConfigError(f"dataset path {spec!r} is not a demo set (demo:<name>)")
    name, _, query = spec[len(DEMO_PREFIX) :].partition("?")
    if name not in DEMO_TASKS:
        raise ConfigError(f"dataset path {spec!r}: unknown demo task {name!r}; known: {', '.join(DEMO_TASKS)}")
    # keep_blank_values so 'ops=' is reported as invalid rather than dropped; '+' must stay a plus sign
    pairs = parse_qsl(query.replace("+", "%2B"), keep_blank_values=True, strict_parsing=bool(query))
    return name, dict(pairs)


def arithmetic_options(spec: str) -> ArithmeticOptions:
    """The options a ``demo:<task>?...`` spec names (the task's options type; defaults for absent keys)."""
    name, raw = parse_spec(spec)
    options = DEMO_OPTIONS[name]
    fields = {f.name: f for f in dataclasses.fields(options)}
    values: dict[str, object] = {}
    for key, text in raw.items():
        if key not in fields:
            raise ConfigError(f"dataset path {spec!r}: unknown option {key!r}; known: {', '.join(fields)}")
        kind = type(getattr(options(), key))
        try:
            values[key] = kind(text)
        except ValueError as exc:
            raise ConfigError(f"dataset path {spec!r}: option {key}={text!r} is not a {kind.__name__}") from exc
    return options(**values)  # type: ignore[arg-type]


def _demo_records(spec: str, split: Split) -> list[Record]:
    name, _ = parse_spec(spec)
    train, evaluation = generate_splits(arithmetic_options(spec))
    problems = train if split == "train" else evaluation
    tools = calculator.TOOLS if name == "calculator" else ()
    return [Record(p.question, str(p.answer), tools) for p in problems]


def _jsonl_records(path: Path, prompt_key: str, answer_key: str) -> list[Record]:
    if not path.is_file():
        raise ConfigError(f"dataset file {str(path)!r} does not exist")
    records = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict) or prompt_key not in row or answer_key not in row:
                raise ConfigError(f"{path}:{line_no}: needs an object with keys {prompt_key!r} and {answer_key!r}")
            records.append(Record(str(row[prompt_key]), str(row[answer_key])))
    if not records:
        raise ConfigError(f"dataset file {str(path)!r} holds no records")
    return records


def load_records(
    spec: str, split: Split = "train", *, prompt_key: str = "prompt", answer_key: str = "answer"
) -> list[Record]:
    """The records of ``spec`` (a demo spec or a ``.jsonl`` path); ``split`` only matters for demo sets."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split={split!r} must be 'train' or 'eval'")
    if spec.startswith(DEMO_PREFIX):
        return _demo_records(spec, split)
    path = Path(spec).expanduser()
    if path.suffix == ".jsonl":
        return _jsonl_records(path, prompt_key, answer_key)
    raise ConfigError(f"dataset path {spec!r}: expected demo:<name> or a local .jsonl file")


def load_split(cfg: DatasetConfig, split: Split) -> list[Record]:
    """The ``split`` records of a job's dataset section (see the module docstring for the rule)."""
    spec = cfg.path
    if split == "eval" and cfg.eval_path is not None:
        spec = cfg.eval_path
    elif split == "eval" and not spec.startswith(DEMO_PREFIX):
        raise ConfigError(f"dataset.eval_path is not set and dataset.path={spec!r} has no eval split; set eval_path")
    return load_records(spec, split, prompt_key=cfg.prompt_key, answer_key=cfg.answer_key)


def default_system_prompt(spec: str) -> str:
    """The system prompt a task is rendered with when ``rollout.workflow.system_prompt`` is null."""
    if spec.startswith(DEMO_PREFIX) and parse_spec(spec)[0] == "calculator":
        return calculator.SYSTEM_PROMPT
    return SYSTEM_PROMPT


def wrong_fraction(spec: str, default: float = 0.0) -> float:
    """The SFT wrong-answer fraction of a demo spec; ``default`` for other datasets."""
    return arithmetic_options(spec).wrong_fraction if spec.startswith(DEMO_PREFIX) else default
