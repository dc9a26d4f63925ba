"""The ``shapes`` demo task: small synthetic images drawn with Pillow, with a verifiable integer answer.

Three kinds (:class:`ShapesOptions`, ``kind``), each answered in the demo tasks' format ``Answer: N``:

* ``count``: "How many shapes are in the image?" -- 1 to ``max_count`` filled squares, circles and
  triangles of random colours, each in its own cell of a g x g grid (g = ceil(sqrt(max_count)), at
  least 2: 2 x 2 for the default 4; jittered inside its cell) on a dark background; the answer is
  their number.
* ``colour``: "Which colour covers more of the image, red (1) or blue (2)?" -- a red and a blue
  rectangle, one in each half of the image, whose areas differ by at least a third; the answer is 1 or 2.
* ``digit``: "Which digit is shown?" -- one seven-segment digit 0-9 (position and stroke jittered);
  the answer is the digit.

Images are ``size`` x ``size`` RGB (64 by default: the tiny VLM's processor keeps at most 64 x 64
pixels, 16 image tokens). :func:`generate_visual_splits` draws ``n_eval + n_train`` problems with
*distinct drawings* from ``random.Random(seed)`` and gives the first ``n_eval`` to the eval split and
the rest to the train split, so the splits are disjoint and the same options always give the same
images in the same order. Pillow is imported when images are drawn.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

__all__ = ["KINDS", "ShapesOptions", "VisualProblem", "draw", "generate_visual_splits"]

KINDS = ("count", "colour", "digit")
QUESTIONS = {
    "count": "How many shapes are in the image?",
    "colour": "Which colour covers more of the image, red (1) or blue (2)?",
    "digit": "Which digit is shown?",
}
#: the most shapes of a ``count`` image (one per cell of a 4 x 4 grid).
MAX_COUNT = 16
_BACKGROUND = (16, 16, 24)
_PALETTE = ((230, 60, 60), (60, 200, 80), (70, 110, 240), (240, 210, 60), (220, 90, 220), (240, 240, 240))
_RED, _BLUE = (230, 50, 50), (50, 80, 235)
#: the lit segments of each digit (a, b, c, d, e, f, g: top, top right, bottom right, bottom,
#: bottom left, top left, middle).
_SEGMENTS = {
    0: "abcdef",
    1: "bc",
    2: "abged",
    3: "abgcd",
    4: "fgbc",
    5: "afgcd",
    6: "afgedc",
    7: "abc",
    8: "abcdefg",
    9: "abcdfg",
}
#: draws tried per wanted problem before giving up on finding distinct ones.
_ATTEMPTS_PER_PROBLEM = 50


@dataclass(frozen=True)
class ShapesOptions:
    """Kind and size of the generated task (the ``demo:shapes?...`` query keys)."""

    #: ``count``, ``colour`` or ``digit`` (see the module docstring).
    kind: str = "count"
    #: ``count``: the most shapes in one image (1..16).
    max_count: int = 4
    #: image side in pixels (32..256).
    size: int = 64
    #: train-split problems.
    n_train: int = 1000
    #: eval-split problems.
    n_eval: int = 64
    #: generation seed (fixes the images and the split).
    seed: int = 0
    #: fraction of SFT demonstrations that carry a wrong answer (see ``datasets/sft.py``).
    wrong_fraction: float = 0.3

    def __post_init__(self) -> None:
        problems = []
        if self.kind not in KINDS:
            problems.append(f"kind={self.kind!r} must be one of {', '.join(KINDS)}")
        if not isinstance(self.max_count, int) or not 1 <= self.max_count <= MAX_COUNT:
            problems.append(f"max_count={self.max_count!r} must be an int in 1..{MAX_COUNT}")
        if not isinstance(self.size, int) or not 32 <= self.size <= 256:
            problems.append(f"size={self.size!r} must be an int in 32..256 pixels")
        if self.n_train < 1 or self.n_eval < 0:
            problems.append(f"n_train={self.n_train!r} must be >= 1 and n_eval={self.n_eval!r} >= 0")
        if not 0.0 <= self.wrong_fraction <= 1.0:
            problems.append(f"wrong_fraction={self.wrong_fraction!r} must be in [0, 1]")
        if problems:
            raise ConfigError("shapes task: " + "; ".join(problems))

    @property
    def answers(self) -> tuple[int, ...]:
        """Every answer this kind can have."""
        if self.kind == "count":
            return tuple(range(1, self.max_count + 1))
        return (1, 2) if self.kind == "colour" else tuple(range(10))


@dataclass(frozen=True)
class VisualProblem:
    """One problem: what to draw (``kind`` and its ``layout``), the question and the answer."""

    kind: str
    answer: int
    #: the drawing's parameters (hashable: two problems with equal layouts draw the same image).
    layout: tuple[Any, ...]
    size: int

    @property
    def question(self) -> str:
        """The user-facing question text (the image comes with it)."""
        return QUESTIONS[self.kind]

    def image(self) -> Image.Image:
        """The problem's RGB image (drawn anew on each call)."""
        return draw(self)


def grid_of(max_count: int) -> int:
    """Cells per side of a ``count`` image's grid: ceil(sqrt(max_count)), at least 2."""
    return max(2, math.isqrt(max_count - 1) + 1)


def _count_layout(answer: int, size: int, rng: random.Random, max_count: int) -> tuple[Any, ...]:
    grid = grid_of(max_count)
    cell = size // grid
    cells = rng.sample(range(grid * grid), answer)
    shapes = []
    for index in sorted(cells):
        # a pixel of margin on every side of a cell: shapes of neighbouring cells never touch
        side = rng.randint(min(cell * 5 // 8, cell - 2), min(cell * 7 // 8, cell - 2))
        x = (index % grid) * cell + 1 + rng.randint(0, cell - side - 2)
        y = (index // grid) * cell + 1 + rng.randint(0, cell - side - 2)
        shapes.append((rng.choice(("square", "circle", "triangle")), x, y, side, rng.randrange(len(_PALETTE))))
    return tuple(shapes)


def _colour_layout(answer: int, size: int, rng: random.Random, max_count: int) -> tuple[Any, ...]:
    half = size // 2
    while True:
        large = (rng.randint(size * 5 // 16, half), rng.randint(size // 2, size * 7 // 8))
        small = (rng.randint(size // 8, size * 5 // 16), rng.randint(size // 8, size // 2))
        if small[0] * small[1] * 3 <= large[0] * large[1] * 2:  # areas differ by at least a third
            break
    red, blue = (large, small) if answer == 1 else (small, large)
    left = rng.random() < 0.5  # red in the left half, or in the right one: they never overlap
    boxes = []
    for colour, (w, h), x0 in ((0, red, 0 if left else half), (1, blue, half if left else 0)):
        boxes.append((colour, x0 + rng.randint(0, half - w), rng.randint(0, size - h), w, h))
    return tuple(boxes)


def _digit_layout(answer: int, size: int, rng: random.Random, max_count: int) -> tuple[Any, ...]:
    height = rng.randint(size * 5 // 8, size * 7 // 8)
    width = height // 2 + rng.randint(0, size // 8)
    stroke = rng.randint(max(2, size // 16), max(3, size // 10))
    x = rng.randint(0, size - width)
    y = rng.randint(0, size - height)
    return (x, y, width, height, stroke, rng.randrange(len(_PALETTE)))


_LAYOUTS = {"count": _count_layout, "colour": _colour_layout, "digit": _digit_layout}


def draw(problem: VisualProblem) -> Image.Image:
    """The RGB image of ``problem``."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (problem.size, problem.size), _BACKGROUND)
    pen = ImageDraw.Draw(image)
    if problem.kind == "count":
        for shape, x, y, side, colour in problem.layout:
            box = (x, y, x + side - 1, y + side - 1)
            if shape == "square":
                pen.rectangle(box, fill=_PALETTE[colour])
            elif shape == "circle":
                pen.ellipse(box, fill=_PALETTE[colour])
            else:
                pen.polygon(
                    [(x + side // 2, y), (x, y + side - 1), (x + side - 1, y + side - 1)], fill=_PALETTE[colour]
                )
    elif problem.kind == "colour":
        for colour, x, y, w, h in problem.layout:
            pen.rectangle((x, y, x + w - 1, y + h - 1), fill=_RED if colour == 0 else _BLUE)
    else:
        _draw_digit(pen, problem.answer, *problem.layout)
    return image


def _draw_digit(pen: Any, digit: int, x: int, y: int, w: int, h: int, stroke: int, colour: int) -> None:
    half = h // 2
    bars = {
        "a": (x, y, x + w - 1, y + stroke - 1),
        "d": (x, y + h - stroke, x + w - 1, y + h - 1),
        "g": (x, y + half - stroke // 2, x + w - 1, y + half - stroke // 2 + stroke - 1),
        "f": (x, y, x + stroke - 1, y + half),
        "b": (x + w - stroke, y, x + w - 1, y + half),
        "e": (x, y + half, x + stroke - 1, y + h - 1),
        "c": (x + w - stroke, y + half, x + w - 1, y + h - 1),
    }
    for segment in _SEGMENTS[digit]:
        pen.rectangle(bars[segment], fill=_PALETTE[colour])


def generate_visual_splits(opts: ShapesOptions) -> tuple[list[VisualProblem], list[VisualProblem]]:
    """``(train, eval)``: ``n_train`` and ``n_eval`` problems with distinct drawings, deterministic in
    ``opts`` (answers drawn uniformly from :attr:`ShapesOptions.answers`). ConfigError when the kind
    cannot make that many distinct images."""
    rng = random.Random(opts.seed)
    wanted = opts.n_eval + opts.n_train
    layout_of = _LAYOUTS[opts.kind]
    seen: set[tuple[Any, ...]] = set()
    problems: list[VisualProblem] = []
    for _ in range(wanted * _ATTEMPTS_PER_PROBLEM):
        if len(problems) == wanted:
            break
        answer = rng.choice(opts.answers)
        layout = layout_of(answer, opts.size, rng, opts.max_count)
        if (answer, layout) in seen:
            continue
        seen.add((answer, layout))
        problems.append(VisualProblem(opts.kind, answer, layout, opts.size))
    else:
        if len(problems) < wanted:
            raise ConfigError(
                f"shapes task kind={opts.kind!r}, size={opts.size}: found only {len(problems)} distinct images of the "
                f"{wanted} asked for (n_train + n_eval); ask for fewer or use a larger size"
            )
    logger.debug("shapes/%s: %d train + %d eval problems (seed %d)", opts.kind, opts.n_train, opts.n_eval, opts.seed)
    return problems[opts.n_eval :], problems[: opts.n_eval]
