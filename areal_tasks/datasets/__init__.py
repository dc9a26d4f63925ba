"""Datasets: the built-in demo tasks, JSONL prompt files, prompt rendering and verifiable rewards.

Torch-free. ``load_records(spec, split)`` resolves a ``dataset.path`` value (``demo:arithmetic``
or ``demo:calculator``, the same questions for tool-using agents, with optional ``?key=value``
options, or a local ``.jsonl`` file) to a list of :class:`Record`; ``render_prompt`` /
``render_transcript`` / ``render_messages`` turn a record or a whole chat into token ids through
the tokenizer's chat template; ``arithmetic_reward`` scores a completion by exact integer match of
its final answer.

The answer format (one for every task here): the completion ends with ``Answer: N`` where ``N`` is
an integer; :func:`extract_answer` takes the last such occurrence.
"""

from areal_tasks.datasets.answers import ANSWER_FORMAT, extract_answer, format_answer
from areal_tasks.datasets.arithmetic import ArithmeticOptions, ArithmeticProblem, generate_splits
from areal_tasks.datasets.calculator import CalculatorOptions
from areal_tasks.datasets.prompts import SYSTEM_PROMPT, render_messages, render_prompt, render_transcript
from areal_tasks.datasets.registry import Record, default_system_prompt, load_records, parse_spec
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
    "parse_spec",
    "render_messages",
    "render_prompt",
    "render_transcript",
]
