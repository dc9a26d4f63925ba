"""The CUDA comparison runs of the inference throughput benchmark (``inference_throughput.py
--variants``): the greedy engine on runners built with one setting changed from the server's
default, each with its decode forward's times and kernels, and whether its greedy outputs equal the
default server's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from inference_profile import decode_kernels, forward_and_sampling_times  # benchmarks/, the script's directory
from inference_report import Rows
from inference_runs import timed_engine_run, warm_up

#: key -> (label, RunnerConfig overrides, Engine overrides).
VARIANTS = {
    "pointwise": ("pointwise compiled", {"compile_scope": "pointwise"}, {}),
    "sdpa": ("SDPA decode attention", {"decode_attention": "sdpa"}, {}),
    "prefill32k": ("max_prefill_tokens 32768", {}, {"max_prefill_tokens": 32768}),
}


def run_variants(
    variants: list[str],
    model_dir: Path,
    device: str,
    args: argparse.Namespace,
    prompts: list[list[int]],
    reference: list[list[int]],
    rows: Rows,
    step_parts: list[dict],
    kernels: dict,
) -> None:
    """Each variant's greedy engine at ``len(prompts)`` sequences (its runner built for that many),
    added to ``rows``; its decode forward times extend ``step_parts`` and its kernels ``kernels``.
    ``reference``: the default server's greedy outputs of the same prompts."""
    from areal_tasks.inference.server.cuda_graph import build_runner
    from areal_tasks.inference.server.engine import Engine
    from areal_tasks.inference.server.model_runner import RunnerConfig

    batch = len(prompts)
    for variant in variants:
        label, overrides, engine_overrides = VARIANTS[variant]
        runner = build_runner(
            RunnerConfig(
                str(model_dir),
                dtype=args.dtype,
                device=device,
                max_running_requests=batch,
                context_length=args.prompt_len + args.new_tokens + 8,
                **overrides,
            )
        )
        engine = Engine(
            runner,
            **{
                "max_prefill_tokens": args.max_prefill_tokens,
                "prefix_cache": args.prefix_cache == "on",
                **engine_overrides,
            },
        )
        engine.start()
        try:
            warm_up(engine, prompts)
            seconds, outputs, anatomy = timed_engine_run(
                engine, prompts, args.new_tokens, {"temperature": 0.0}, args.repeats
            )
            rows.measured(f"embedded engine, greedy, {label}", batch, seconds, mode="greedy", path="engine", **anatomy)
        finally:
            engine.shutdown()
        same = sum(a == b for a, b in zip(outputs, reference))
        print(f"{label} vs the default server: {same}/{len(reference)} greedy outputs identical")
        step_parts += [
            {**row, "what": f"{row['what']} ({variant})"}
            for row in forward_and_sampling_times(runner, batch)
            if row["what"].startswith("decode forward")
        ]
        kernels[variant] = decode_kernels(runner, batch)
        del engine, runner
        torch.cuda.empty_cache()
