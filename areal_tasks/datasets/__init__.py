"""Datasets: the built-in demo tasks, data files through HF ``datasets``, prompt rendering and rewards.

Torch-free (``datasets`` itself is imported only when data files are read). ``load_records(spec,
split, columns=, options=)`` resolves a ``dataset.path`` value (``demo:arithmetic`` or
``demo:calculator``, the same questions for tool-using agents, with optional ``?key=value`` options;
or parquet / JSON / JSONL / Arrow files, a glob or directory of shards, or a ``save_to_disk``
directory, local or ``file://`` / ``s3://``) to a list of :class:`Record` (prompt or chat, answer,
tests, metadata, by the ``dataset.columns`` mapping); ``load_split(cfg, split)`` applies it to a
job's dataset section, ``stream_records`` reads files as a stream (``dataset.streaming``).
``render_prompt`` / ``render_chat`` / ``render_record`` / ``render_transcript`` /
``render_messages`` turn a record or a whole chat into token ids through the tokenizer's chat
template; ``arithmetic_reward`` scores a completion by exact integer match of its final answer. See
``docs/datasets.md``.

The demo tasks' answer format: the completion ends with ``Answer: N`` where ``N`` is an integer;
:func:`extract_answer` takes the last such occurrence.
"""

from areal_tasks.datasets.answers import ANSWER_FORMAT, extract_answer, format_answer
from areal_tasks.datasets.arithmetic import ArithmeticOptions, ArithmeticProblem, generate_splits
from areal_tasks.datasets.calculator import CalculatorOptions
from areal_tasks.datasets.prompts import (
    SYSTEM_PROMPT,
    render_chat,
    render_messages,
    render_prompt,
    render_record,
    render_transcript,
)
from areal_tasks.datasets.registry import (
    Record,
    default_system_prompt,
    load_records,
    load_split,
    parse_spec,
    stream_records,
)
from areal_tasks.datasets.reward import accuracy, arithmetic_reward
from areal_tasks.datasets.sft import Demonstration, build_demonstrations

__all__ = [
    "ANSWER_FORMAT",
    "SYSTEM_PROMPT",
    "ArithmeticOptions",
    "ArithmeticProblem",
    "CalculatorOptions",
    "Demonstration",
    "Record",
    "accuracy",
    "arithmetic_reward",
    "build_demonstrations",
    "default_system_prompt",
    "extract_answer",
    "format_answer",
    "generate_splits",
    "load_records",
    "load_split",
    "parse_spec",
    "render_chat",
    "render_messages",
    "render_prompt",
    "render_record",
    "render_transcript",
    "stream_records",
]
