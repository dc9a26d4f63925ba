"""Processed images kept by content, so an image sent again is decoded and processed once.

GRPO sends each prompt ``n`` times, each as its own request carrying the same images, and a partial
rollout resubmitted after a weight update carries them again; multi-turn agents resend a chat's
earlier images every turn. Without a cache every copy is decoded (``images.py``) and run through
the image processor on the server's ``tokenize`` lane, the CPU work that bounds how many image
prompts a server admits per second.

:class:`ProcessedImageCache` maps the wire form of an image (its base64 string or data URL, hashed
with BLAKE2b) to the processor's output for it alone: its ``pixel_values`` rows and its
``image_grid_thw`` row. The Qwen2-VL image processors treat images one by one and concatenate
their patches, so the rows of a prompt's images put together equal one processor call over them
all (``tests/unit/inference_server/test_image_cache.py`` checks it). The cache holds at most
``max_bytes`` of pixel values, least recently used first out; 0 turns it off. A cached image has
passed the checks of ``images.py`` when it was first decoded, and the checks depend on its bytes
alone, so a hit is as checked as a miss. Threads of the ``tokenize`` lane share it (one lock; two
threads missing the same image at once both process it, and one copy is kept).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from areal_tasks.inference.server.images import check_image_count, image_bytes, open_image

__all__ = ["ImageCacheStats", "ProcessedImageCache"]


@dataclass(frozen=True)
class ImageCacheStats:
    """What the cache holds and has served (its counters since the server started)."""

    images: int
    bytes: int
    hits: int
    misses: int


def _key(value: Any) -> bytes | None:
    """The cache key of a wire image (None for a value that is no string: it is refused anyway)."""
    if not isinstance(value, str):
        return None
    return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class ProcessedImageCache:
    """The image processor's output per image, by content (see the module doc)."""

    def __init__(self, process: Callable[[list[Any]], dict[str, torch.Tensor]], max_bytes: int) -> None:
        #: ``process(images) -> {"pixel_values", "image_grid_thw"}``: the model's image processor.
        self.process = process
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def stats(self) -> ImageCacheStats:
        """The cache's size and counters now."""
        with self._lock:
            return ImageCacheStats(len(self._entries), self._bytes, self._hits, self._misses)

    def processed(self, values: list[Any], field: str = "image_data") -> tuple[torch.Tensor, torch.Tensor]:
        """``(pixel_values, image_grid_thw)`` of one prompt's wire images, in order, as one processor
        call over them would give; only the images not cached are decoded (and checked: a bad one
        is the 400 of ``images.py``, naming its index in ``values``) and processed."""
        check_image_count(values, field)
        keys = [_key(value) for value in values]
        found: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with self._lock:
            for i, key in enumerate(keys):
                entry = self._entries.get(key) if key is not None else None
                if entry is not None:
                    self._entries.move_to_end(key)  # type: ignore[arg-type]
                    found[i] = entry
        first_of: dict[bytes, int] = {}  # an image twice in one prompt is processed once
        missing = []
        for i, key in enumerate(keys):
            if i not in found and (key is None or first_of.setdefault(key, i) == i):
                missing.append(i)
        if missing:
            images = [open_image(image_bytes(values[i], i, field), i, field) for i in missing]
            output = self.process(images)
            grids = output["image_grid_thw"].long()
            pieces = output["pixel_values"].float().split(grids.prod(dim=-1).tolist())
            for i, piece, grid in zip(missing, pieces, grids):
                found[i] = (piece, grid)
                self._keep(keys[i], piece, grid)
        with self._lock:
            self._hits += len(values) - len(missing)
            self._misses += len(missing)
        parts = [found[i] if i in found else found[first_of[keys[i]]] for i in range(len(values))]  # type: ignore[index]
        return torch.cat([pixels for pixels, _ in parts]), torch.stack([grid for _, grid in parts])

    def _keep(self, key: bytes | None, pixels: torch.Tensor, grid: torch.Tensor) -> None:
        size = pixels.numel() * pixels.element_size()
        if key is None or size > self.max_bytes:
            return
        if pixels.untyped_storage().nbytes() != size:  # a piece of a batch's tensor would keep all of it
            pixels = pixels.clone()
        entry = (pixels, grid.clone())
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:  # another thread processed it meanwhile
                self._bytes -= previous[0].numel() * previous[0].element_size()
            self._entries[key] = entry
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (old, _) = self._entries.popitem(last=False)
                self._bytes -= old.numel() * old.element_size()
