"""Eval sets: name them, load them through the dataset loader, cut them to ``max_items``.

An eval set is given as a URL the dataset loader reads (``load_split(dataset with eval_path=URL,
"eval")``: a ``.jsonl`` of ``{"prompt", "answer"}`` objects, a demo spec, and whatever else the
loader accepts) or as ``NAME=URL`` to choose its name. Without a name, the set is named after the
URL's last path component without its extensions (``/data/gsm8k_test.jsonl`` -> ``gsm8k_test``,
``demo:arithmetic?digits=2`` -> ``arithmetic``); a repeated name gets ``-2``, ``-3``... With no URL
at all, the config's own eval split is the one set (named ``eval``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from areal_tasks.errors import AReaLError, EvaluationError

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig
    from areal_tasks.datasets.registry import Record

logger = logging.getLogger(__name__)

__all__ = ["EvalSet", "load_sets", "parse_set_arg"]

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
#: the set name of the config's own eval split.
CONFIG_SET = "eval"


@dataclass(frozen=True)
class EvalSet:
    """One eval set: its ``name`` (key in the report), ``source`` (URL as given) and records."""

    name: str
    source: str | None
    records: list[Record]


def parse_set_arg(arg: str) -> tuple[str | None, str]:
    """``"gsm8k=/d/test.jsonl"`` -> ``("gsm8k", "/d/test.jsonl")``; a plain URL -> ``(None, url)``."""
    name, sep, url = arg.partition("=")
    if sep and _NAME.match(name) and url:
        return name, url
    return None, arg


def default_name(url: str) -> str:
    """A set's name from its URL: the last path component before any query, extensions dropped."""
    path = url.split("?", 1)[0].rstrip("/")
    last = re.split(r"[/:\\]", path)[-1] or path
    stem = last.split(".", 1)[0]
    return stem or "set"


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def load_sets(cfg: JobConfig, data: Sequence[str], max_items: int | None = None) -> list[EvalSet]:
    """The eval sets of ``data`` (``[]``: the config's eval split), each cut to its first ``max_items``.

    Raises :class:`EvaluationError` naming the set that cannot be read or holds no records.
    """
    from areal_tasks.datasets.registry import load_split

    if max_items is not None and max_items < 1:
        raise EvaluationError(f"max_items={max_items} must be >= 1 (or unset: every item)")
    parsed = [parse_set_arg(arg) for arg in data] or [(CONFIG_SET, None)]
    names = _unique([name or default_name(url or CONFIG_SET) for name, url in parsed])
    sets = []
    for name, (_, url) in zip(names, parsed, strict=True):
        dataset = cfg.dataset if url is None else dataclasses.replace(cfg.dataset, eval_path=url)
        shown = url if url is not None else f"the config's eval split ({cfg.dataset.eval_path or cfg.dataset.path})"
        try:
            records = load_split(dataset, "eval")
        except (AReaLError, OSError, ValueError) as exc:  # a loader error, a file it cannot open or decode
            raise EvaluationError(
                f"eval set {name!r} ({shown}) cannot be read: {exc}. Give a .jsonl file of "
                "{'prompt': ..., 'answer': ...} objects, a demo:<task> spec, or another dataset URL the loader reads"
            ) from exc
        records = records[:max_items]
        if not records:
            raise EvaluationError(f"eval set {name!r} ({shown}) holds no records")
        logger.info("eval set %s: %d items from %s", name, len(records), shown)
        sets.append(EvalSet(name, url, records))
    return sets
