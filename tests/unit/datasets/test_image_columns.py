"""Image data sets from disk through HF ``datasets``: ``dataset.columns.images`` maps a column holding an
``Image`` feature (or a list of them), encoded bytes, or file paths relative to the data's folder to
a record's images; a missing column, file or unreadable image is a ConfigError naming the row."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from areal_tasks.config.sections import ColumnsConfig, DatasetConfig
from areal_tasks.datasets.columns import local_folder
from areal_tasks.datasets.images import image_list, to_image
from areal_tasks.datasets.registry import load_records, load_split, stream_records
from areal_tasks.datasets.shapes import ShapesOptions, generate_visual_splits
from areal_tasks.datasets.stream import record_from_json, record_to_json
from areal_tasks.errors import ConfigError

datasets = pytest.importorskip("datasets")

COLUMNS = ColumnsConfig(prompt="question", answer="answer", images="image")


def problems(n: int) -> list:
    train, _ = generate_visual_splits(ShapesOptions(kind="digit", n_train=n, n_eval=0, seed=3))
    return train


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_parquet_with_an_image_feature_written_by_datasets(tmp_path: Path) -> None:
    shown = problems(3)
    features = datasets.Features(
        {"question": datasets.Value("string"), "answer": datasets.Value("int64"), "image": datasets.Image()}
    )
    rows = {"question": [p.question for p in shown], "answer": [p.answer for p in shown], "image": []}
    rows["image"] = [p.image() for p in shown]
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(tmp_path / "digits.parquet"))

    records = load_records(str(tmp_path / "digits.parquet"), columns=COLUMNS)
    assert [r.answer for r in records] == [str(p.answer) for p in shown]
    for record, problem in zip(records, shown):
        assert len(record.images) == 1 and record.images[0].mode == "RGB"
        assert record.images[0].tobytes() == problem.image().tobytes()  # PNG is lossless
    # the same mapping as a stream, and as a job's dataset section
    stream = stream_records(str(tmp_path / "digits.parquet"), columns=COLUMNS)
    streamed = list(stream.epoch(0, seed=0, shuffle=False))
    assert [r.images[0].tobytes() for r in streamed] == [r.images[0].tobytes() for r in records]
    cfg = DatasetConfig(path=str(tmp_path / "digits.parquet"), columns=COLUMNS)
    assert len(load_split(cfg, "train")[0].images) == 1
    # a streamed record handed out but not trained yet survives a checkpoint with its image
    saved = json.loads(json.dumps(record_to_json(streamed[0])))
    assert record_from_json(saved).images[0].tobytes() == streamed[0].images[0].tobytes()
    assert record_from_json(saved).answer == streamed[0].answer


def test_a_list_of_images_per_row_in_a_save_to_disk_directory(tmp_path: Path) -> None:
    shown = problems(4)
    features = datasets.Features(
        {
            "question": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "image": datasets.Sequence(datasets.Image()),
        }
    )
    rows = {
        "question": ["Which digits are shown?", "And here?"],
        "answer": [f"{shown[0].answer}{shown[1].answer}", f"{shown[2].answer}{shown[3].answer}"],
        "image": [[shown[0].image(), shown[1].image()], [shown[2].image(), shown[3].image()]],
    }
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "pairs"))
    records = load_records(str(tmp_path / "pairs"), columns=COLUMNS)
    assert [len(r.images) for r in records] == [2, 2]
    assert records[1].images[1].tobytes() == shown[3].image().tobytes()


def test_jsonl_with_image_paths_relative_to_its_folder(tmp_path: Path) -> None:
    shown = problems(2)
    (tmp_path / "data" / "img").mkdir(parents=True)
    lines = []
    for i, problem in enumerate(shown):
        problem.image().save(tmp_path / "data" / "img" / f"{i}.png")
        lines.append(json.dumps({"question": problem.question, "answer": problem.answer, "image": f"img/{i}.png"}))
    (tmp_path / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    for spec in (str(tmp_path / "data" / "train.jsonl"), str(tmp_path / "data"), str(tmp_path / "data" / "*.jsonl")):
        records = load_records(spec, columns=COLUMNS)
        assert [r.images[0].tobytes() for r in records] == [p.image().tobytes() for p in shown], spec
    # an absolute path needs no folder; a missing file names the row and the file
    (tmp_path / "abs.jsonl").write_text(json.dumps({"question": "q", "answer": 1, "image": "img/9.png"}) + "\n")
    with pytest.raises(ConfigError, match=r"row 1: column 'image' \(dataset.columns.images\): image file .*img/9.png"):
        load_records(str(tmp_path / "abs.jsonl"), columns=COLUMNS)


def test_a_missing_image_column_names_the_setting_and_the_columns(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(json.dumps({"question": "q", "answer": 1, "images": "x.png"}) + "\n")
    with pytest.raises(ConfigError, match=r"dataset.columns.images='image'.*dataset.columns.images=images"):
        load_records(str(tmp_path / "t.jsonl"), columns=COLUMNS)


def test_image_values_and_their_errors(tmp_path: Path) -> None:
    image = problems(1)[0].image()
    rgba = image.convert("RGBA")
    assert to_image(rgba, "x").mode == "RGB"
    assert to_image(png(image), "x").tobytes() == image.tobytes()
    assert to_image({"bytes": png(image), "path": None}, "x").tobytes() == image.tobytes()
    image.save(tmp_path / "a.png")
    assert to_image({"bytes": None, "path": str(tmp_path / "a.png")}, "x").size == (64, 64)
    assert to_image("a.png", "x", base_dir=tmp_path).size == (64, 64)
    assert len(image_list([image, png(image)], "x")) == 2
    with pytest.raises(ConfigError, match="row 3: cannot read the image"):
        to_image(b"not a png", "row 3")
    with pytest.raises(ConfigError, match="relative and the data set has no local folder"):
        to_image("a.png", "row 1")
    with pytest.raises(ConfigError, match=r"an image must be .*; got int"):
        to_image(7, "row 2")
    with pytest.raises(ConfigError, match="the image list is empty"):
        image_list([], "row 4")


def test_the_local_folder_of_a_data_path(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.jsonl").write_text("")
    assert local_folder(str(tmp_path / "d" / "f.jsonl")) == tmp_path / "d"
    assert local_folder(f"file://{tmp_path / 'd'}") == tmp_path / "d"
    assert local_folder(str(tmp_path / "d" / "part-*.parquet")) == tmp_path / "d"
    assert local_folder("s3://bucket/data/train.parquet") is None
