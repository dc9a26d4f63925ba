"""Images of an OpenAI chat request: ``{"type": "image_url", "image_url": {"url": "data:..."}}`` parts.

:func:`chat_images` collects the images of ``messages`` in the order the chat template renders
their placeholders (message by message, part by part), refusing with a 400 that names the part
an ``image_url`` part without a URL string or one that is not a ``data:`` URL (this server
fetches nothing). :func:`without_images` is ``messages`` with those URLs left out, for measuring
the text of a chat against the context before it is rendered (an image's bytes are no text).
"""

from __future__ import annotations

import logging
from typing import Any

from areal_tasks.errors import InferenceRequestError

logger = logging.getLogger(__name__)


def _image_parts(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(where, part)`` of every ``image_url`` content part, in order."""
    found = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                found.append((f"messages[{i}].content[{j}].image_url", part))
    return found


def chat_images(messages: list[dict[str, Any]]) -> list[str]:
    """The data URLs of the chat's ``image_url`` parts, in order (see the module doc)."""
    urls = []
    for where, part in _image_parts(messages):
        image_url = part.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
        if not isinstance(url, str) or not url:
            raise InferenceRequestError(
                f"{where}: give the image as {{'url': 'data:image/...;base64,...'}}", param=where
            )
        if not url.startswith("data:"):
            scheme = url.split(":", 1)[0] if ":" in url else "a path"
            raise InferenceRequestError(
                f"{where}.url: only data: URLs are accepted ({scheme!r} given): this server fetches no URL and "
                "reads no file; send data:image/<png|jpeg|...>;base64,<bytes>",
                param=f"{where}.url",
            )
        urls.append(url)
    return urls


def without_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the ``image_url`` parts left out (for measuring text)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            kept = [p for p in content if not (isinstance(p, dict) and p.get("type") == "image_url")]
            out.append({**message, "content": kept})
        else:
            out.append(message)
    return out
