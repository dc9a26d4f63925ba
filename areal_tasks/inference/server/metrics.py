"""Prometheus ``/metrics`` in the text exposition format, under SGLang's metric names.

Gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:gen_throughput``
(generated tokens/s over the last 10 s), ``sglang:token_usage`` (filled KV positions / capacity)
``areal:paused`` (1 while paused) and ``areal:weight_update_draining`` (1 while a weight update
holds new requests back until those in flight finish); counters ``sglang:prompt_tokens_total``,
``sglang:generation_tokens_total`` and ``sglang:num_requests_total``; and ``areal:decode_steps_total``,
``areal:decode_seconds_total`` (host time in decode steps) and ``areal:decode_wait_seconds_total``
(the part of it spent waiting for the device: near the whole, decoding is device-bound; near zero,
host-bound); ``areal:prefill_batches_total`` and ``areal:prefill_seconds_total`` (admission prefills
and their host time: a burst that reached the engine in many waves shows as many prefills). The
prefix cache (``prefix_cache.py``): counter ``sglang:cached_tokens_total`` (prompt positions whose
KV was reused instead of prefilled), gauge ``sglang:cache_hit_rate`` (those over all prompt
positions admitted: ``cached / (cached + prompt_tokens_total)``), and gauges
``areal:prefix_cache_entries`` and ``areal:prefix_cache_retained_tokens`` (the entries, live and
retained, and the positions kept in free slots). A vision-language model's processed images
(``image_cache.py``): counters ``areal:image_cache_hits_total`` and ``areal:image_cache_misses_total``
(images served from the cache, and processed), gauge ``areal:image_cache_bytes``. Every sample
carries the ``model_name`` label, like SGLang's.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from areal_tasks.inference.server.stats import EngineStats

if TYPE_CHECKING:
    from areal_tasks.inference.server.image_cache import ImageCacheStats

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(stats: EngineStats, model_name: str, images: ImageCacheStats | None = None) -> str:
    """The exposition text for one snapshot (``images``: a vision-language model's image cache)."""
    usage = stats.cache_used_tokens / stats.cache_capacity_tokens if stats.cache_capacity_tokens else 0.0
    rows = [
        ("sglang:num_running_reqs", "gauge", "The number of running requests.", stats.num_running),
        ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", stats.num_waiting),
        ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", stats.gen_throughput),
        ("sglang:token_usage", "gauge", "The token usage.", usage),
        ("areal:paused", "gauge", "1 while generation is paused.", int(stats.paused is not None)),
        (
            "areal:weight_update_draining",
            "gauge",
            "1 while a weight update waits for requests in flight.",
            int(stats.draining),
        ),
        ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", stats.prompt_tokens_total),
        (
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            stats.generation_tokens_total,
        ),
        ("sglang:num_requests_total", "counter", "Number of requests processed.", stats.requests_finished_total),
        ("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.", stats.cached_tokens_total),
        ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", stats.cache_hit_rate),
        ("areal:prefix_cache_entries", "gauge", "Prefix-cache entries, live and retained.", stats.prefix_cache_entries),
        (
            "areal:prefix_cache_retained_tokens",
            "gauge",
            "KV positions the prefix cache keeps in free slots.",
            stats.prefix_cache_retained_tokens,
        ),
        ("areal:decode_steps_total", "counter", "Decode steps run.", stats.decode_steps_total),
        ("areal:decode_seconds_total", "counter", "Host seconds spent in decode steps.", stats.decode_seconds_total),
        (
            "areal:decode_wait_seconds_total",
            "counter",
            "Of the decode steps' host seconds, those spent waiting for the device.",
            stats.decode_wait_seconds_total,
        ),
        ("areal:prefill_batches_total", "counter", "Admission prefills run.", stats.prefill_batches_total),
        (
            "areal:prefill_seconds_total",
            "counter",
            "Host seconds spent in admission prefills.",
            stats.prefill_seconds_total,
        ),
    ]
    if images is not None:
        rows += [
            ("areal:image_cache_hits_total", "counter", "Images served from the processed-image cache.", images.hits),
            ("areal:image_cache_misses_total", "counter", "Images decoded and processed.", images.misses),
            ("areal:image_cache_bytes", "gauge", "Pixel-value bytes the image cache holds.", images.bytes),
        ]
    label = f'{{model_name="{_escape(model_name)}"}}'
    lines = []
    for name, kind, doc, value in rows:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{label} {float(value)!r}"]
    return "\n".join(lines) + "\n"
