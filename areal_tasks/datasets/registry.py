"""Resolve a ``dataset.path`` value to records.

Accepted forms:

* ``demo:arithmetic`` with optional options as a query string, e.g.
  ``demo:arithmetic?digits=2&ops=+&n_train=500&n_eval=50&seed=3&wrong_fraction=0.3`` (the fields of
  :class:`~areal_tasks.datasets.arithmetic.ArithmeticOptions`). A demo set has both splits.
* ``demo:shapes`` with options likewise (the fields of
  :class:`~areal_tasks.datasets.shapes.ShapesOptions`, e.g. ``demo:shapes?kind=colour&n_train=500``):
  small images drawn with Pillow and a question about them, each record carrying its image in
  ``images`` (a task for vision-language models, through the ``vision`` workflow).
* ``demo:calculator`` with the same options (two-digit ``+-`` by default, see
  :class:`~areal_tasks.datasets.calculator.CalculatorOptions`): the same questions, each record
  carrying the calculator's tool schema in ``tools`` (a task for tool-using agents).
* data files, read through HF ``datasets`` (:mod:`~areal_tasks.datasets.hf_source`): a parquet,
  JSON/JSONL or Arrow file, a glob or directory of such shards, or a ``save_to_disk`` directory; a
  local path or a ``file://`` / ``s3://`` URL (``dataset.options`` and the AWS environment reach
  S3). ``dataset.columns`` maps their columns to a :class:`Record`'s prompt (or chat), answer, tests
  metadata and images (:mod:`~areal_tasks.datasets.columns`). A file set has one split; the eval split
  comes from ``dataset.eval_path``.

:func:`load_split` applies that rule to a ``DatasetConfig``: ``train`` reads ``path``; ``eval`` reads
``eval_path`` when set, else the eval split of a demo ``path``. :func:`train_data` is what the
rollout executor gets: the loaded train split with too-long prompts dropped (and counted), or with
``dataset.streaming`` a :class:`~areal_tasks.datasets.stream.RecordStream`. ``datasets`` is imported
only when files are read, so this module stays light and torch-free. See ``docs/datasets.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl

from areal_tasks.datasets import calculator
from areal_tasks.datasets.arithmetic import ArithmeticOptions, generate_splits
from areal_tasks.datasets.prompts import SYSTEM_PROMPT
from areal_tasks.datasets.shapes import ShapesOptions, generate_visual_splits
from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.config.sections import ColumnsConfig, DatasetConfig
    from areal_tasks.datasets.columns import RecordMapper
    from areal_tasks.datasets.stream import RecordStream

logger = logging.getLogger(__name__)

Split = Literal["train", "eval"]
DEMO_PREFIX = "demo:"
#: each demo task's options type (its fields are the spec's query keys).
DEMO_OPTIONS: dict[str, type[ArithmeticOptions] | type[ShapesOptions]] = {
    "arithmetic": ArithmeticOptions,
    "calculator": calculator.CalculatorOptions,
    "shapes": ShapesOptions,
}
DEMO_TASKS = tuple(DEMO_OPTIONS)


@dataclass(frozen=True)
class Record:
    """One prompt and what its reward is scored against.

    ``prompt``: the user prompt text (for a chat record, the text of its last user message);
    ``answer``: the reference answer as text (rewards parse it; empty when the set has only tests);
    ``tools``: the OpenAI tool schemas an agent offers for it (empty for plain prompts);
    ``messages``: a chat (``{role, content}`` dicts) rendered through the chat template instead of
    ``prompt``; ``tests``: unit tests for the reward (``tests=``); ``metadata``: other columns for the
    reward (``metadata=``); ``images``: the RGB Pillow images the prompt shows (rendered before its
    text by the ``vision`` workflow; empty for text prompts).
    """

    prompt: str
    answer: str
    tools: tuple[dict[str, Any], ...] = ()
    messages: tuple[dict[str, Any], ...] | None = None
    tests: str | None = None
    metadata: Mapping[str, Any] | None = None
    images: tuple[Any, ...] = ()


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


def arithmetic_options(spec: str) -> ArithmeticOptions | ShapesOptions:
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
    options = arithmetic_options(spec)
    if isinstance(options, ShapesOptions):
        train_images, eval_images = generate_visual_splits(options)
        shown = train_images if split == "train" else eval_images
        return [Record(p.question, str(p.answer), images=(p.image(),)) for p in shown]
    train, evaluation = generate_splits(options)
    problems = train if split == "train" else evaluation
    tools = calculator.TOOLS if name == "calculator" else ()
    return [Record(p.question, str(p.answer), tools) for p in problems]


def _mapper(spec: str, columns: ColumnsConfig | None) -> RecordMapper:
    from areal_tasks.config.sections import ColumnsConfig
    from areal_tasks.datasets.columns import RecordMapper

    return RecordMapper(columns if columns is not None else ColumnsConfig(), spec)


def _file_records(spec: str, columns: ColumnsConfig | None, options: Mapping[str, Any] | None) -> list[Record]:
    from areal_tasks.datasets.hf_source import locate, open_dataset

    mapper = _mapper(spec, columns)
    ds = open_dataset(locate(spec, options))
    mapper.check_columns(ds.column_names)
    if len(ds) == 0:
        raise ConfigError(f"dataset path {spec!r} holds no records")
    ds = ds.select_columns(mapper.needed)
    records = [mapper.record(row, f"row {i + 1}") for i, row in enumerate(ds)]
    logger.info("dataset %s: %d records", spec, len(records))
    return records


def load_records(
    spec: str,
    split: Split = "train",
    *,
    columns: ColumnsConfig | None = None,
    options: Mapping[str, Any] | None = None,
) -> list[Record]:
    """The records of ``spec`` (a demo spec, or data files: see the module docstring); ``split`` only
    matters for demo sets; ``columns`` maps the files' columns (default ``prompt`` and ``answer``);
    ``options`` are storage options for ``s3://`` URLs."""
    if split not in ("train", "eval"):
        raise ConfigError(f"split={split!r} must be 'train' or 'eval'")
    if spec.startswith(DEMO_PREFIX):
        return _demo_records(spec, split)
    return _file_records(spec, columns, options)


def stream_records(
    spec: str, *, columns: ColumnsConfig | None = None, options: Mapping[str, Any] | None = None
) -> RecordStream:
    """``spec``'s data files as a :class:`~areal_tasks.datasets.stream.RecordStream` (never all in memory)."""
    from areal_tasks.datasets.hf_source import locate, open_dataset
    from areal_tasks.datasets.stream import RecordStream

    if spec.startswith(DEMO_PREFIX):
        raise ConfigError(f"dataset path {spec!r}: a demo set is generated in memory; set dataset.streaming=false")
    return RecordStream(open_dataset(locate(spec, options), streaming=True), _mapper(spec, columns), source=spec)


def split_spec(cfg: DatasetConfig, split: Split) -> str:
    """The path ``split`` reads: ``train`` reads ``path``; ``eval`` reads ``eval_path`` when set, else
    the eval split of a demo ``path`` (ConfigError for a file path without ``eval_path``)."""
    if split == "eval" and cfg.eval_path is not None:
        return cfg.eval_path
    if split == "eval" and not cfg.path.startswith(DEMO_PREFIX):
        raise ConfigError(
            f"dataset.eval_path is not set and dataset.path={cfg.path!r} has no eval split; set eval_path"
        )
    return cfg.path


def load_split(cfg: DatasetConfig, split: Split) -> list[Record]:
    """The ``split`` records of a job's dataset section, loaded (see :func:`split_spec` for the rule)."""
    return load_records(split_spec(cfg, split), split, columns=cfg.columns, options=cfg.options)


def train_data(cfg: DatasetConfig, keep: Callable[[Record], bool] | None = None) -> list[Record] | RecordStream:
    """The training prompts for the rollout executor: loaded (with ``keep`` applied now, the drops
    logged), or a stream that applies ``keep`` as it reads (``dataset.streaming``)."""
    if cfg.streaming:
        return stream_records(cfg.path, columns=cfg.columns, options=cfg.options).with_filter(keep)
    records = load_split(cfg, "train")
    if keep is None:
        return records
    kept = [r for r in records if keep(r)]
    logger.info(
        "dataset %s: dropped %d of %d prompts longer than dataset.max_prompt_len",
        cfg.path,
        len(records) - len(kept),
        len(records),
    )
    if not kept:
        raise ConfigError(f"dataset.max_prompt_len drops every training prompt of {cfg.path!r}")
    return kept


def default_system_prompt(spec: str) -> str:
    """The system prompt a task is rendered with when ``rollout.workflow.system_prompt`` is null."""
    if spec.startswith(DEMO_PREFIX) and parse_spec(spec)[0] == "calculator":
        return calculator.SYSTEM_PROMPT
    return SYSTEM_PROMPT


def wrong_fraction(spec: str, default: float = 0.0) -> float:
    """The SFT wrong-answer fraction of a demo spec; ``default`` for other datasets."""
    return arithmetic_options(spec).wrong_fraction if spec.startswith(DEMO_PREFIX) else default
