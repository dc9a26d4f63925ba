"""Images of dataset records: what a data row may hold, as Pillow images, and their wire form.

A record's images (:attr:`~areal_tasks.datasets.registry.Record.images`) are RGB ``PIL.Image``
objects. :func:`to_image` makes one from what a data set holds: a Pillow image (an HF ``Image``
feature decoded), encoded PNG/JPEG bytes, an HF ``Image`` value left undecoded (``{"bytes": ...,
"path": ...}``), or a local file path (relative paths are resolved against ``base_dir``, the data
file's folder: the JSONL-with-paths form). :func:`image_list` accepts one image or a list of them.
Pillow is imported when an image is converted.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from PIL import Image

logger = logging.getLogger(__name__)

__all__ = ["image_list", "to_image"]

#: what a value holding an image may be, for error messages.
IMAGE_FORMS = "a Pillow image, PNG/JPEG bytes, an HF Image value ({'bytes', 'path'}) or a file path"


def _open(data: bytes | str | Path, where: str) -> Image.Image:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as opened:
            return opened.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise ConfigError(f"{where}: cannot read the image ({type(exc).__name__}: {exc})") from exc


def to_image(value: Any, where: str, base_dir: str | Path | None = None) -> Image.Image:
    """The RGB Pillow image ``value`` holds (see the module docstring); ConfigError naming ``where``."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return value if value.mode == "RGB" else value.convert("RGB")
    if isinstance(value, (bytes, bytearray)):
        return _open(bytes(value), where)
    if isinstance(value, Mapping) and (value.get("bytes") is not None or value.get("path") is not None):
        if value.get("bytes") is not None:
            return _open(bytes(value["bytes"]), where)
        value = value["path"]
    if isinstance(value, (str, Path)) and str(value).strip():
        path = Path(value).expanduser()
        if not path.is_absolute():
            if base_dir is None:
                raise ConfigError(
                    f"{where}: image path {str(value)!r} is relative and the data set has no local folder to "
                    "resolve it against; use absolute paths or store the images in the data (an Image column)"
                )
            path = Path(base_dir) / path
        if not path.is_file():
            raise ConfigError(f"{where}: image file {str(path)!r} does not exist")
        return _open(path, where)
    shown = type(value).__name__
    raise ConfigError(f"{where}: an image must be {IMAGE_FORMS}; got {shown}")


def image_list(value: Any, where: str, base_dir: str | Path | None = None) -> tuple[Image.Image, ...]:
    """The images of a column value: one image, or a non-empty list of them (each as :func:`to_image`)."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        if not value:
            raise ConfigError(f"{where}: the image list is empty; a row with an image column needs an image")
        return tuple(to_image(v, f"{where} image {i + 1}", base_dir) for i, v in enumerate(value))
    return (to_image(value, where, base_dir),)
