"""``areal model detect|tiny``: describe a model, recommend a layout, build a tiny model.

``areal model detect PATH [--gpus N [--gpu-memory-gb G]]`` prints the ModelInfo JSON (plus a
``recommended`` layout when ``--gpus`` is given); ``areal model tiny --family F --out DIR [--seed S]
[--set KEY=VALUE ...]`` writes a tiny random model (config overrides parsed as int, float or bool
where they look like one) and prints its path and detection JSON. A bad path or family is a
ModelError, which ``main`` prints on stderr with exit 2. Heavy imports happen inside handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from areal_tasks.errors import ModelError
from areal_tasks.models.layout import TRAIN_DTYPES
from areal_tasks.models.tiny.spec import parse_value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "model",
        help="detect a model's architecture, recommend a layout, or build a tiny test model",
        description="Inspect Hugging Face models (local directory, hub id or tiny:<family>) and build tiny ones.",
    )
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND", parser_class=type(parser))
    sub.required = True

    detect = sub.add_parser("detect", help="print the model's architecture facts as JSON")
    detect.add_argument("path", help="model directory, hub id (org/name) or tiny:<family>")
    detect.add_argument("--gpus", type=int, default=None, metavar="N", help="also recommend a layout for N GPUs")
    detect.add_argument(
        "--gpu-memory-gb", type=float, default=80.0, metavar="G", help="memory per GPU in GB (default 80)"
    )
    detect.add_argument("--train-dtype", default="bfloat16", choices=TRAIN_DTYPES)
    detect.set_defaults(handler=run_detect)

    tiny = sub.add_parser("tiny", help="write a tiny random-weight model (with tokenizer) to a directory")
    tiny.add_argument("--family", required=True, help="model family, e.g. qwen2, llama, qwen3_moe")
    tiny.add_argument("--out", required=True, metavar="DIR", help="directory to write the model files into")
    tiny.add_argument("--seed", type=int, default=0, help="weight-initialisation seed (default 0)")
    tiny.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config field, e.g. --set hidden_size=128 (repeatable)",
    )
    tiny.set_defaults(handler=run_tiny)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["hidden_size=128"]`` -> ``{"hidden_size": 128}``; ModelError for an item without ``=``."""
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ModelError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = parse_value(value)
    return overrides


def run_detect(args: argparse.Namespace) -> int:
    """Print ``detect_model(args.path)`` (and a layout recommendation with ``--gpus``) as JSON."""
    from areal_tasks.models import detect_model, recommend_layout

    info = detect_model(args.path)
    payload = info.to_dict()
    if args.gpus is not None:
        payload["recommended"] = recommend_layout(info, args.gpus, args.gpu_memory_gb, args.train_dtype).to_dict()
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    return 0


def run_tiny(args: argparse.Namespace) -> int:
    """Build the tiny ``args.family`` model into ``args.out`` and print its path and detection JSON."""
    from areal_tasks.models import build_tiny_model, detect_model

    overrides = parse_overrides(args.overrides)
    path = build_tiny_model(args.family, seed=args.seed, out_dir=args.out, **overrides)
    payload = {"path": str(path), "model": detect_model(str(path)).to_dict()}
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")
    return 0
