"""What the processed-image cache saves a vision server per request (CPU work on its ``tokenize`` lane).

A GRPO group sends one prompt ``n`` times, each request carrying the prompt's image; without the
cache each copy is decoded and run through the image processor (``inference/server/image_cache.py``).
For each image processor and image size this times one request's image work as the server does it
(``ProcessedImageCache.processed``: decode, check, process, or a cache hit) over groups of ``n``
requests with one distinct image per group, the cache off (0 bytes) and on, and the full
``VisionPreparer.prepare`` of the kit's tiny Qwen2-VL (rotary positions included) both ways.

Processors: ``tiny`` (the kit's tiny Qwen2-VL: images resized to at most 64 patches) and
``qwen2-vl`` (``Qwen2VLImageProcessor``'s defaults, those of the released Qwen2-VL models: 14-pixel
patches, up to 1,280 merged tokens per image). Images are random RGB PNGs (the slowest to decode).

Prints a table and writes JSON (``benchmarks/results/image_cache_cpu.json`` by default).

Usage::

    python benchmarks/image_cache.py                       # about a minute on 2 cores
    python benchmarks/image_cache.py --sizes 224,448 --n 8,16 --groups 8
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from areal_tasks.inference.server.image_cache import ProcessedImageCache

RESULTS = Path(__file__).resolve().parent / "results"


def random_png(seed: int, size: int) -> str:
    from PIL import Image

    pixels = torch.randint(0, 256, (size, size, 3), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def processors() -> dict[str, tuple[Any, Any]]:
    """name -> (image processor, tiny model runner or None)."""
    from transformers import AutoImageProcessor, Qwen2VLImageProcessor

    from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig
    from areal_tasks.models import build_tiny_model

    path = build_tiny_model("qwen2_vl")
    runner = ModelRunner(RunnerConfig(str(path), device="cpu", max_running_requests=2, context_length=4096))
    return {"tiny": (AutoImageProcessor.from_pretrained(path), runner), "qwen2-vl": (Qwen2VLImageProcessor(), None)}


def time_requests(make_work: Any, images: list[str], n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean milliseconds per request: every image sent ``n`` times in
    a row, each repeat with a fresh (cold) cache from ``make_work()``."""
    runs = []
    for _ in range(repeats):
        work = make_work()
        started = time.perf_counter()
        for image in images:
            for _ in range(n):
                work(image)
        runs.append((time.perf_counter() - started) * 1e3 / (len(images) * n))
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,224,448,896", help="square image sides in pixels")
    parser.add_argument("--n", default="1,8", help="requests per image (a GRPO group's size)")
    parser.add_argument("--groups", type=int, default=4, help="distinct images per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the lane's calls share the CPU)")
    parser.add_argument("--out", type=Path, default=RESULTS / "image_cache_cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    group_sizes = [int(s) for s in args.n.split(",") if s]
    rows = []
    jobs = [(name, size, n) for name in ("tiny", "qwen2-vl") for size in sizes for n in group_sizes]
    loaded = processors()
    seed = 0
    for name, size, n in tqdm(jobs, desc="image cache", unit="case"):
        processor, runner = loaded[name]
        process = lambda images, p=processor: p(images=images, return_tensors="pt")  # noqa: E731
        row: dict[str, Any] = {"processor": name, "size": size, "n": n}
        for label, max_bytes in (("off", 0), ("on", 1 << 30)):
            seed += 1
            images = [random_png(seed * 1000 + g, size) for g in range(args.groups)]
            ProcessedImageCache(process, max_bytes).processed([random_png(0, size)])  # first-call costs

            def cached(b: int = max_bytes) -> Any:
                processed = ProcessedImageCache(process, b).processed
                return lambda image: processed([image])

            row[f"ms_{label}"] = time_requests(cached, images, n, args.repeats)
            if runner is not None:
                config = runner.model.config  # text, <|vision_start|><|image_pad|><|vision_end|>, text
                ids = [40, config.vision_start_token_id, runner.vision.image_token_id, config.vision_end_token_id, 41]

                def preparer(r: Any = runner, b: int = max_bytes, i: list[int] = ids) -> Any:
                    r.vision.images = ProcessedImageCache(process, b)
                    return lambda image: r.vision.prepare(i, [image])

                row[f"prepare_ms_{label}"] = time_requests(preparer, images, n, args.repeats)
        row["speedup"] = row["ms_off"] / row["ms_on"]
        rows.append(row)
    header = (
        f"{'processor':<10} {'image':>9} {'n':>3} {'ms/request off':>15} {'on':>9} {'speedup':>8} "
        f"{'prepare off':>12} {'on':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        prep = (
            f"{r['prepare_ms_off']:>12.2f} {r['prepare_ms_on']:>8.2f}"
            if "prepare_ms_off" in r
            else f"{'-':>12} {'-':>8}"
        )
        print(
            f"{r['processor']:<10} {r['size']:>4}x{r['size']:<4} {r['n']:>3} {r['ms_off']:>15.2f} {r['ms_on']:>9.2f} "
            f"{r['speedup']:>7.1f}x {prep}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"machine": platform.node(), "cpu_count": torch.get_num_threads(), "torch": torch.__version__}
    args.out.write_text(
        json.dumps({"meta": meta, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
