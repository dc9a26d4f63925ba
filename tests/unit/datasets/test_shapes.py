"""The ``shapes`` demo task: seeded, disjoint splits of distinct images whose answer the pixels verify."""

from __future__ import annotations

from collections import Counter

import pytest

from areal_tasks.datasets.registry import load_records, parse_spec
from areal_tasks.datasets.sft import build_demonstrations
from areal_tasks.datasets.shapes import KINDS, ShapesOptions, VisualProblem, generate_visual_splits, grid_of
from areal_tasks.errors import ConfigError

BACKGROUND = (16, 16, 24)


def pixels(problem: VisualProblem) -> list[tuple[int, int, int]]:
    image = problem.image()
    assert image.mode == "RGB" and image.size == (problem.size, problem.size)
    return list(image.get_flattened_data())


def count_blobs(problem: VisualProblem) -> int:
    """Connected non-background regions (4-neighbourhood) of the image."""
    size = problem.size
    lit = {(i % size, i // size) for i, p in enumerate(pixels(problem)) if p != BACKGROUND}
    blobs = 0
    while lit:
        blobs += 1
        stack = [lit.pop()]
        while stack:
            x, y = stack.pop()
            for neighbour in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if neighbour in lit:
                    lit.remove(neighbour)
                    stack.append(neighbour)
    return blobs


@pytest.mark.parametrize("kind", KINDS)
def test_splits_are_seeded_disjoint_and_distinct(kind: str) -> None:
    opts = ShapesOptions(kind=kind, n_train=120, n_eval=30, seed=5)
    train, evaluation = generate_visual_splits(opts)
    again_train, again_eval = generate_visual_splits(opts)
    assert (len(train), len(evaluation)) == (120, 30)
    assert [p.layout for p in train] == [p.layout for p in again_train]
    assert [p.image().tobytes() for p in evaluation[:5]] == [p.image().tobytes() for p in again_eval[:5]]
    drawings = {(p.answer, p.layout) for p in train + evaluation}
    assert len(drawings) == 150  # distinct, hence disjoint splits
    other, _ = generate_visual_splits(ShapesOptions(kind=kind, n_train=120, n_eval=30, seed=6))
    assert [p.layout for p in other] != [p.layout for p in train]
    # every answer of the kind appears, and only those
    assert set(Counter(p.answer for p in train)) == set(opts.answers)


def test_count_images_show_as_many_separate_shapes_as_the_answer() -> None:
    train, _ = generate_visual_splits(ShapesOptions(kind="count", n_train=40, n_eval=0))
    for problem in train:
        assert count_blobs(problem) == problem.answer, problem
    many, _ = generate_visual_splits(ShapesOptions(kind="count", max_count=9, n_train=20, n_eval=0))
    assert all(count_blobs(p) == p.answer for p in many)
    assert [grid_of(n) for n in (1, 4, 5, 9, 10, 16)] == [2, 2, 3, 3, 4, 4]


def test_colour_images_show_more_of_the_answered_colour() -> None:
    train, _ = generate_visual_splits(ShapesOptions(kind="colour", n_train=40, n_eval=0))
    for problem in train:
        counts = Counter(pixels(problem))
        red, blue = counts[(230, 50, 50)], counts[(50, 80, 235)]
        assert (red > blue * 1.4) if problem.answer == 1 else (blue > red * 1.4), (problem, red, blue)


SEGMENTS = {
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


def test_digit_images_light_exactly_the_seven_segments_of_the_answer() -> None:
    x, y, w, h, stroke = 10, 4, 24, 48, 4
    centres = {  # the middle of each segment's bar
        "a": (x + w // 2, y + stroke // 2),
        "d": (x + w // 2, y + h - stroke // 2),
        "g": (x + w // 2, y + h // 2),
        "f": (x + stroke // 2, y + h // 4),
        "b": (x + w - stroke // 2, y + h // 4),
        "e": (x + stroke // 2, y + 3 * h // 4),
        "c": (x + w - stroke // 2, y + 3 * h // 4),
    }
    for digit, segments in SEGMENTS.items():
        image = VisualProblem("digit", digit, (x, y, w, h, stroke, 0), 64).image()
        lit = {name for name, point in centres.items() if image.getpixel(point) != BACKGROUND}
        assert lit == set(segments), digit
    train, _ = generate_visual_splits(ShapesOptions(kind="digit", n_train=30, n_eval=0))
    assert all(count_blobs(p) == 1 for p in train)  # one connected figure, inside the image


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": "shade"}, "kind='shade' must be one of count, colour, digit"),
        ({"max_count": 17}, "max_count=17 must be an int in 1..16"),
        ({"size": 16}, "size=16 must be an int in 32..256"),
        ({"n_train": 0}, "n_train=0 must be >= 1"),
        ({"wrong_fraction": 1.5}, r"wrong_fraction=1.5 must be in \[0, 1\]"),
    ],
)
def test_bad_options_are_config_errors(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ShapesOptions(**options)


def test_too_many_images_for_the_kind_is_a_config_error() -> None:
    # one shape on a 32x32 image: 4 cells x 55 places and sizes x 3 shapes x 6 colours = 3960 drawings
    with pytest.raises(ConfigError, match="found only 3960 distinct images of the 5000 asked for"):
        generate_visual_splits(ShapesOptions(kind="count", max_count=1, size=32, n_train=4000, n_eval=1000))


def test_the_demo_spec_gives_records_with_their_image() -> None:
    assert parse_spec("demo:shapes?kind=digit&n_train=8") == ("shapes", {"kind": "digit", "n_train": "8"})
    train = load_records("demo:shapes?kind=count&n_train=12&n_eval=4&seed=2", "train")
    evaluation = load_records("demo:shapes?kind=count&n_train=12&n_eval=4&seed=2", "eval")
    assert (len(train), len(evaluation)) == (12, 4)
    record = train[0]
    assert record.prompt == "How many shapes are in the image?" and record.answer in {"1", "2", "3", "4"}
    assert len(record.images) == 1 and record.images[0].size == (64, 64)
    with pytest.raises(ConfigError, match="unknown option 'colours'"):
        load_records("demo:shapes?colours=3")


def test_demonstrations_keep_the_images_before_the_prompt() -> None:
    records = load_records("demo:shapes?kind=colour&n_train=10&n_eval=0", "train")
    demos = build_demonstrations(records, wrong_fraction=0.3, seed=1)
    assert sum(not d.correct for d in demos) == 3
    messages = demos[0].messages("sys")
    assert messages[1] == {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": records[0].prompt}],
    }
    assert demos[0].images == records[0].images
    assert messages[-1]["role"] == "assistant" and messages[-1]["content"].startswith("Answer: ")
