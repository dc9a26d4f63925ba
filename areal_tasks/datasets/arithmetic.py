"""The ``arithmetic`` demo task: "What is 23 + 48?" with integer answers, generated from a seed.

Difficulty knobs (:class:`ArithmeticOptions`): ``digits`` (operands are drawn from
``0 .. 10**digits - 1``) and ``ops`` (any of ``+`` and ``-``, a difference may be negative, and
``>``: "the larger of a and b", a comparison that even a tiny model learns in a few minutes, so
the partly wrong SFT demonstrations, not the model's capacity, set how much RL can gain).
:func:`generate_splits` draws ``n_eval + n_train`` *distinct* problems with ``random.Random(seed)``
and gives the first ``n_eval`` to the eval split and the rest to the train split, so the splits
are disjoint and the same seed always gives the same problems in the same order. Asking for more
problems than the space holds (``(10**digits)**2 * len(ops)``) is a ConfigError.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

_OPS = ("+", "-", ">")
#: spaces up to this size are enumerated and shuffled; larger ones are sampled with rejection.
_ENUMERATE_LIMIT = 200_000


@dataclass(frozen=True)
class ArithmeticOptions:
    """Shape and size of the generated task."""

    #: operands have at most this many digits.
    digits: int = 1
    #: operators to use, a string over ``+`` and ``-``.
    ops: str = "+-"
    #: train-split problems.
    n_train: int = 160
    #: eval-split problems.
    n_eval: int = 40
    #: generation seed (fixes the problems and the split).
    seed: int = 0
    #: fraction of SFT demonstrations that carry a wrong answer (see ``datasets/sft.py``).
    wrong_fraction: float = 0.3

    def __post_init__(self) -> None:
        if not isinstance(self.digits, int) or not 1 <= self.digits <= 6:
            raise ConfigError(f"arithmetic digits={self.digits!r} must be an int in 1..6")
        if not self.ops or any(op not in _OPS for op in self.ops) or len(set(self.ops)) != len(self.ops):
            raise ConfigError(f"arithmetic ops={self.ops!r} must be distinct characters from {''.join(_OPS)!r}")
        if self.n_train < 1 or self.n_eval < 0:
            raise ConfigError(f"arithmetic n_train={self.n_train!r} must be >= 1 and n_eval={self.n_eval!r} >= 0")
        if not 0.0 <= self.wrong_fraction <= 1.0:
            raise ConfigError(f"arithmetic wrong_fraction={self.wrong_fraction!r} must be in [0, 1]")
        if self.n_train + self.n_eval > self.space_size:
            raise ConfigError(
                f"arithmetic n_train + n_eval = {self.n_train + self.n_eval} exceeds the {self.space_size} distinct "
                f"problems of digits={self.digits}, ops={self.ops!r}; raise digits or ask for fewer problems"
            )

    @property
    def space_size(self) -> int:
        """How many distinct problems these digits and operators allow."""
        return (10**self.digits) ** 2 * len(self.ops)


@dataclass(frozen=True)
class ArithmeticProblem:
    """One problem: ``left op right``."""

    left: int
    op: str
    right: int

    @property
    def question(self) -> str:
        """The user-facing question text."""
        if self.op == ">":
            return f"Which is larger, {self.left} or {self.right}?"
        return f"What is {self.left} {self.op} {self.right}?"

    @property
    def answer(self) -> int:
        """The exact integer result."""
        if self.op == ">":
            return max(self.left, self.right)
        return self.left + self.right if self.op == "+" else self.left - self.right


def _decode(index: int, opts: ArithmeticOptions) -> ArithmeticProblem:
    base = 10**opts.digits
    op_index, rest = divmod(index, base * base)
    left, right = divmod(rest, base)
    return ArithmeticProblem(left, opts.ops[op_index], right)


def _distinct_indices(opts: ArithmeticOptions, count: int) -> list[int]:
    rng = random.Random(opts.seed)
    if opts.space_size <= _ENUMERATE_LIMIT:
        indices = list(range(opts.space_size))
        rng.shuffle(indices)
        return indices[:count]
    chosen: list[int] = []
    seen: set[int] = set()
    while len(chosen) < count:
        index = rng.randrange(opts.space_size)
        if index not in seen:
            seen.add(index)
            chosen.append(index)
    return chosen


def generate_splits(opts: ArithmeticOptions) -> tuple[list[ArithmeticProblem], list[ArithmeticProblem]]:
    """``(train, eval)``: disjoint lists of ``n_train`` and ``n_eval`` problems, deterministic in ``opts``."""
    indices = _distinct_indices(opts, opts.n_eval + opts.n_train)
    problems = [_decode(i, opts) for i in indices]
    logger.debug("arithmetic: %d train + %d eval problems (seed %d)", opts.n_train, opts.n_eval, opts.seed)
    return problems[opts.n_eval :], problems[: opts.n_eval]
