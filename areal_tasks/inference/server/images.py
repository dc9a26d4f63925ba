"""Images of a request: from the wire (base64 or ``data:`` URLs) to checked RGB pictures.

An image travels as SGLang's ``image_data`` entry or an OpenAI ``image_url`` part: a base64 string
of the image file's bytes, or a ``data:image/<type>;base64,<bytes>`` URL. Nothing else is read:
an ``http(s)://`` or ``file://`` URL, or a path, is refused (the server fetches nothing and opens
no file a request names). Each refusal is an :class:`~areal_tasks.errors.InferenceRequestError`
(a 400) naming the image by its index and what to send instead.

Bounds: at most :data:`MAX_IMAGES_PER_PROMPT` images per prompt, formats in
:data:`IMAGE_FORMATS`, and at most :data:`MAX_IMAGE_PIXELS` pixels per image, checked from the
file's header before its pixels are decoded (so a small file that would inflate to gigabytes
is refused without being decoded). The body limit (``body_limit.py``) bounds the encoded bytes.
"""

from __future__ import annotations

import base64
import binascii
import io
import logging
import re
from typing import Any

from areal_tasks.errors import InferenceRequestError

logger = logging.getLogger(__name__)

#: images one prompt may carry.
MAX_IMAGES_PER_PROMPT = 32
#: width x height of one image at most (before the processor resizes it).
MAX_IMAGE_PIXELS = 4096 * 4096
#: host memory the processed images of a server may keep by content, in MiB (``image_cache.py``).
DEFAULT_IMAGE_CACHE_MB = 256
#: the image file formats accepted (Pillow's names).
IMAGE_FORMATS = frozenset({"PNG", "JPEG", "GIF", "WEBP", "BMP"})

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_DATA_URL = re.compile(r"^data:(?P<mime>[^;,]*)(?P<params>(;[^;,]*)*),", re.DOTALL)
_SEND_INSTEAD = "send the image file's bytes as base64 or as a data:image/...;base64 URL"


def _refuse(field: str, index: int, message: str) -> InferenceRequestError:
    return InferenceRequestError(f"{field}[{index}]: {message}", param=field)


def image_bytes(value: Any, index: int, field: str = "image_data") -> bytes:
    """The file bytes of one wire image (see the module doc for what is accepted)."""
    if not isinstance(value, str) or not value:
        raise _refuse(field, index, f"must be a non-empty string; {_SEND_INSTEAD}")
    payload = value
    if value.startswith("data:"):
        match = _DATA_URL.match(value)
        if match is None:
            raise _refuse(field, index, f"a data URL without a ',' before its data; {_SEND_INSTEAD}")
        mime, params = match.group("mime").strip().lower(), match.group("params").lower()
        if not mime.startswith("image/"):
            raise _refuse(field, index, f"a data URL of type {mime or 'text/plain'!r}, not image/*")
        if ";base64" not in params:
            raise _refuse(field, index, "a data URL without ;base64: only base64 data URLs are accepted")
        payload = value[match.end() :]
    elif _SCHEME.match(value):  # base64 has no ':'
        scheme = value.split(":", 1)[0]
        raise _refuse(field, index, f"a {scheme}: URL; this server fetches no URL and reads no file: {_SEND_INSTEAD}")
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(
            field, index, f"not base64 (paths and URLs are never read by this server); {_SEND_INSTEAD}"
        ) from None
    if not data:
        raise _refuse(field, index, "the image is empty")
    return data


def open_image(data: bytes, index: int, field: str = "image_data") -> Any:
    """Decode checked image bytes into an RGB ``PIL.Image`` (see the module doc for the bounds)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise _refuse(field, index, f"not an image file this server reads ({type(exc).__name__})") from None
    if image.format not in IMAGE_FORMATS:
        raise _refuse(field, index, f"{image.format} images are not accepted; use one of {sorted(IMAGE_FORMATS)}")
    width, height = image.size
    if width < 1 or height < 1 or width * height > MAX_IMAGE_PIXELS:
        raise _refuse(
            field, index, f"the image is {width}x{height} pixels; at most {MAX_IMAGE_PIXELS} pixels are accepted"
        )
    try:
        image.load()
        return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _refuse(field, index, f"the image could not be decoded ({type(exc).__name__}: {exc})") from None


def check_image_count(values: list[Any], field: str = "image_data") -> None:
    """Refuse more than :data:`MAX_IMAGES_PER_PROMPT` images for one prompt."""
    if len(values) > MAX_IMAGES_PER_PROMPT:
        raise InferenceRequestError(
            f"{field}: {len(values)} images for one prompt; at most {MAX_IMAGES_PER_PROMPT} are accepted", param=field
        )


def decode_images(values: list[Any], field: str = "image_data") -> list[Any]:
    """Every image of one prompt, decoded and checked, in order."""
    check_image_count(values, field)
    return [open_image(image_bytes(value, i, field), i, field) for i, value in enumerate(values)]
