"""The processed-image cache: a prompt's images put together from cached and newly processed ones
equal one image-processor call over them all (Qwen2-VL and Qwen2.5-VL processors, images of
different sizes, in any order); hits and misses are counted; the cache keeps at most its bytes,
least recently used out first, and nothing at 0; a bad image is refused by its index even among
cached ones; threads share it safely; and the server shows it in ``/metrics`` and its info."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from vision_helpers import png, prompt_with_images

from areal_tasks.errors import InferenceError, InferenceRequestError
from areal_tasks.inference.server.image_cache import ImageCacheStats, ProcessedImageCache
from areal_tasks.inference.server.images import decode_images
from areal_tasks.inference.server.metrics import render_metrics
from areal_tasks.inference.server.server import ServerConfig
from areal_tasks.inference.server.stats import EngineStats

SIZES = [(40, 50), (64, 30), (33, 64), (64, 64), (20, 28)]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def processor(request: pytest.FixtureRequest, tiny_model_factory: Any) -> Any:
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(tiny_model_factory(request.param))


def _cache(processor: Any, max_bytes: int = 1 << 30) -> ProcessedImageCache:
    return ProcessedImageCache(lambda images: processor(images=images, return_tensors="pt"), max_bytes)


def _direct(processor: Any, values: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    out = processor(images=decode_images(values), return_tensors="pt")
    return out["pixel_values"].float(), out["image_grid_thw"].long()


def _same(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.equal(got[1], want[1])
    assert got[0].shape == want[0].shape and torch.equal(got[0], want[0])


def test_cached_and_new_images_put_together_equal_one_processor_call(processor: Any) -> None:
    images = [png(i, w, h) for i, (w, h) in enumerate(SIZES)]
    cache = _cache(processor)
    _same(cache.processed(images[:2]), _direct(processor, images[:2]))
    assert cache.stats() == ImageCacheStats(images=2, bytes=cache.stats().bytes, hits=0, misses=2)
    # cached ones among new ones, out of order, one of them twice in the same prompt
    mixed = [images[3], images[1], images[4], images[0], images[3]]
    _same(cache.processed(mixed), _direct(processor, mixed))
    stats = cache.stats()
    assert (stats.images, stats.hits, stats.misses) == (4, 3, 4)  # images[3] is processed once
    _same(cache.processed(mixed), _direct(processor, mixed))
    assert cache.stats().hits == 8 and cache.stats().misses == 4


def test_the_cache_keeps_at_most_its_bytes_least_recently_used_out_first(processor: Any) -> None:
    images = [png(10 + i, 64, 64) for i in range(4)]
    one = _cache(processor)
    one.processed(images[:1])
    size = one.stats().bytes
    cache = _cache(processor, max_bytes=2 * size)
    cache.processed(images[:2])
    cache.processed(images[:1])  # images[0] is now the most recently used
    cache.processed(images[2:3])  # evicts images[1]
    assert cache.stats().images == 2 and cache.stats().bytes == 2 * size
    misses = cache.stats().misses
    cache.processed([images[0], images[2]])
    assert cache.stats().misses == misses
    cache.processed([images[1]])
    assert cache.stats().misses == misses + 1
    off = _cache(processor, max_bytes=0)
    for _ in range(2):
        _same(off.processed(images[:2]), _direct(processor, images[:2]))
    assert off.stats() == ImageCacheStats(images=0, bytes=0, hits=0, misses=4)
    _same(off.processed([images[0], images[0]]), _direct(processor, [images[0], images[0]]))
    assert off.stats().misses == 5  # twice in one prompt: processed once, even without a cache


def test_a_bad_image_among_cached_ones_is_refused_by_its_index(processor: Any) -> None:
    good = png(0, 32, 32)
    cache = _cache(processor)
    cache.processed([good])
    with pytest.raises(InferenceRequestError, match=r"image_data\[1\]: not base64"):
        cache.processed([good, "not an image!"])
    with pytest.raises(InferenceRequestError, match=r"messages\[0\]: must be a non-empty string"):
        cache.processed([None], "messages")
    assert cache.stats().images == 1


def test_threads_share_the_cache(processor: Any) -> None:
    images = [png(20 + i, 48, 40) for i in range(6)]
    want = {i: _direct(processor, [images[i], images[(i + 1) % 6]]) for i in range(6)}
    cache = _cache(processor)
    errors: list[BaseException] = []

    def work(start: int) -> None:
        try:
            for round_ in range(12):
                i = (start + round_) % 6
                _same(cache.processed([images[i], images[(i + 1) % 6]]), want[i])
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    stats = cache.stats()
    assert stats.images == 6 and stats.hits + stats.misses == 4 * 12 * 2
    one = _cache(processor)
    one.processed(images[:1])
    assert stats.bytes == 6 * one.stats().bytes


def test_the_vision_preparer_gives_the_same_prompt_from_the_cache(tiny_qwen2_vl: Path) -> None:
    from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig

    runner = ModelRunner(RunnerConfig(str(tiny_qwen2_vl), device="cpu", max_running_requests=2, context_length=256))
    images = [png(1, 40, 50), png(2, 64, 30)]
    ids = prompt_with_images(2)
    first_ids, first = runner.vision.prepare(ids, images)
    again_ids, again = runner.vision.prepare([*ids, 7, 8], images)  # a resubmitted rollout: prompt + output
    assert again_ids == [*first_ids, 7, 8]
    assert torch.equal(again.pixel_values, first.pixel_values) and torch.equal(
        again.image_grid_thw, first.image_grid_thw
    )
    assert torch.equal(again.positions[:, : len(first_ids)], first.positions) and again.rope_delta == first.rope_delta
    assert runner.vision.images.stats().hits == 2
    again.pixel_values.add_(1.0)  # a prompt's tensors are its own: the cache is untouched
    _, third = runner.vision.prepare(ids, images)
    assert torch.equal(third.pixel_values, first.pixel_values)


def test_metrics_show_the_image_cache_and_the_size_is_checked() -> None:
    stats = EngineStats(
        num_running=0,
        num_waiting=0,
        gen_throughput=0.0,
        cache_used_tokens=0,
        cache_capacity_tokens=10,
        paused=None,
        draining=False,
        prompt_tokens_total=0,
        generation_tokens_total=0,
        requests_finished_total=0,
        weight_version="0",
    )
    text = render_metrics(stats, "m", ImageCacheStats(images=2, bytes=4096, hits=7, misses=3))
    assert 'areal:image_cache_hits_total{model_name="m"} 7.0' in text
    assert 'areal:image_cache_misses_total{model_name="m"} 3.0' in text
    assert 'areal:image_cache_bytes{model_name="m"} 4096.0' in text
    assert "image_cache" not in render_metrics(stats, "m")
    with pytest.raises(InferenceError, match="image_cache_mb must be a whole number of MiB >= 0"):
        ServerConfig(model_path="x", image_cache_mb=-1)
