"""RL-step throughput of the FSDP2 engine: the trainer's ``RLStep`` on rollout-shaped batches, with MFU.

One RL step is what a train rank does between "a batch arrived" and "weights updated"
(``areal_tasks/trainer/rl_step.py``): the log-prob forward that recomputes the proximal policy's
log-probs (decoupled PPO, GRPO's default ``prox_approx=recompute``), group-relative advantages, and
the PPO update in ``--ppo-minibatches`` optimizer steps. The model is the train benchmark's
(``train_throughput.py``: a random Qwen2.5-0.5B shape or ``tiny``); a batch is ``--prompts`` prompts
of ``--prompt-len`` tokens, each sampled ``--group-size`` times with lognormal response lengths
(median ``--response-median``, clipped to ``[16, --max-response]`` and to the micro-batch cap),
with 0/1 rewards: the shapes a rollout produces (the token ids are random: FLOPs and times do not
depend on them).

After ``--warmup`` steps, ``--steps`` steps are timed, each between two device synchronisations
(``RLStep.run`` reads its statistics back at the end). FLOPs of a step: the forward, ``2 * params
* tokens + 2 * layers * heads * head_dim * sum(L^2)``, plus the update, ``6 * params * tokens + 6 *
layers * heads * head_dim * sum(L^2)`` (``train_throughput.py``'s count); MFU against the measured
bf16 matmul peak and against the spec peak (``mfu.py``; ``--peak-flops``, ``--peak-tflops``).
Prints a table and writes JSON (``benchmarks/results/rl_step_throughput_<preset>.json``).

Usage::

    python benchmarks/rl_step_throughput.py --preset tiny --prompts 4 --group-size 2   # CPU, seconds
    python benchmarks/rl_step_throughput.py --preset qwen2.5-0.5b                       # one GPU
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mfu import MEASURED_PEAK_FLOPS, mfu_fields, mfu_lines, spec_peak  # benchmarks/ is first on sys.path
from train_throughput import PRESETS, RESULTS_DIR, _init_distributed, build_model_dir
from train_timing import _sync

from areal_tasks.algo import build_algorithm
from areal_tasks.api.workflow import Trajectory
from areal_tasks.config.algorithm import AlgorithmConfig
from areal_tasks.config.engine import EngineConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.parallel.mesh import ParallelDims
from areal_tasks.trainer.rl_batch import pack_trajectories
from areal_tasks.trainer.rl_step import RLStep


def rollout_batch(args: argparse.Namespace, vocab: int, max_len: int, seed: int) -> dict[str, torch.Tensor]:
    """``--prompts`` groups of ``--group-size`` samples (each at most ``max_len`` tokens), packed as
    the trainer packs rollouts."""
    longest = min(args.max_response, max_len - args.prompt_len)
    rng = np.random.default_rng(seed)
    trajectories = []
    for _ in range(args.prompts):
        prompt = rng.integers(3, vocab, args.prompt_len).tolist()
        for _ in range(args.group_size):
            length = int(np.clip(rng.lognormal(np.log(args.response_median), 1.0), 16, longest))
            response = rng.integers(3, vocab, length).tolist()
            trajectories.append(
                Trajectory(
                    input_ids=prompt + response,
                    loss_mask=[0] * len(prompt) + [1] * length,
                    logprobs=[0.0] * len(prompt) + rng.uniform(-3.0, -0.01, length).tolist(),
                    versions=[-1] * len(prompt) + [0] * length,
                    reward=float(rng.integers(0, 2)),
                    prompt_len=len(prompt),
                )
            )
    return pack_trajectories(trajectories, args.group_size, policy_version=0)


def step_flops(batch: dict[str, torch.Tensor], n_params: int, shape: dict, forwards: int) -> float:
    """Model FLOPs of one RL step: ``forwards`` gradient-free forwards plus one forward + backward."""
    lengths = (batch["cu_seqlens"][1:] - batch["cu_seqlens"][:-1]).double()
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    attn_unit = shape["num_hidden_layers"] * shape["num_attention_heads"] * head_dim * float((lengths**2).sum())
    tokens = float(lengths.sum())
    return (6 + 2 * forwards) * (n_params * tokens + attn_unit)


def run(args: argparse.Namespace) -> dict:
    _init_distributed()
    if dist.get_world_size() != 1:
        raise SystemExit("rl_step_throughput.py runs on one device (no torchrun)")
    model_dir, shape = build_model_dir(args.preset, Path(args.model_root))
    tokens_per_mb = args.tokens_per_mb or PRESETS[args.preset]["tokens_per_mb"]
    cfg = EngineConfig(
        optimizer=OptimizerConfig(lr=1e-6, grad_clip=1.0),
        micro_batch=MicroBatchSpec(n_mbs=1, max_tokens_per_mb=tokens_per_mb),
        dtype=args.dtype,
        compile=args.compile,
    )
    engine = FSDPEngine(
        cfg, str(model_dir), parallel=ParallelDims.for_world(1), total_steps=(args.warmup + args.steps) * 4
    )
    engine.initialize()
    n_params = sum(p.numel() for p in engine.model.parameters())
    algorithm = build_algorithm(AlgorithmConfig.variant_class("grpo")())
    rl_step = RLStep(engine, algorithm, args.group_size, ppo_n_minibatches=args.ppo_minibatches)
    forwards = 1 if algorithm.needs_prox_logprobs else 0
    batches = [
        rollout_batch(args, shape["vocab_size"], tokens_per_mb, seed) for seed in range(args.warmup + args.steps)
    ]
    for batch in batches[: args.warmup]:
        rl_step.run(batch)
    times, tokens, flops = [], [], []
    for batch in batches[args.warmup :]:
        _sync()
        start = time.perf_counter()
        rl_step.run(batch)
        _sync()
        times.append(time.perf_counter() - start)
        tokens.append(int(batch["cu_seqlens"][-1]))
        flops.append(step_flops(batch, n_params, shape, forwards))
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    result = {
        "preset": args.preset,
        "shape": shape,
        "params": n_params,
        "algorithm": "grpo",
        "proximal_forwards_per_step": forwards,
        "prompts": args.prompts,
        "group_size": args.group_size,
        "prompt_len": args.prompt_len,
        "response_median": args.response_median,
        "max_response": args.max_response,
        "ppo_minibatches": args.ppo_minibatches,
        "tokens_per_mb": tokens_per_mb,
        "steps": args.steps,
        "step_times_s": times,
        "step_time_s_median": statistics.median(times),
        "tokens_per_step": statistics.mean(tokens),
        "tokens_per_s": sum(tokens) / sum(times),
        **mfu_fields(sum(flops), sum(times), 1, args.peak_flops, spec_peak(device_name, args.peak_tflops)),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "device": device_name,
        "torch": torch.__version__,
        "kernels": engine.kernels,
    }
    engine.destroy()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--response-median", type=int, default=256)
    parser.add_argument("--max-response", type=int, default=4096)
    parser.add_argument("--ppo-minibatches", type=int, default=1)
    parser.add_argument("--tokens-per-mb", type=int, default=None, help="token cap of a micro-batch (preset default)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--compile", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--peak-flops", type=float, default=MEASURED_PEAK_FLOPS, help="measured bf16 matmul FLOP/s")
    parser.add_argument("--peak-tflops", type=float, default=None, help="spec dense bf16 TFLOP/s (default: by name)")
    parser.add_argument("--model-root", default=str(Path(tempfile.gettempdir()) / "areal_bench_models"))
    parser.add_argument("--out", type=Path, default=None, help="JSON path")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    rows = [
        ("preset", result["preset"]),
        ("device", result["device"]),
        ("params", f"{result['params'] / 1e6:.1f} M"),
        ("batch", f"{args.prompts} prompts x {args.group_size} samples, {result['tokens_per_step']:.0f} tokens"),
        ("step", f"{result['proximal_forwards_per_step']} log-prob forward + {args.ppo_minibatches} PPO update(s)"),
        ("step times", " ".join(f"{t:.3f}" for t in result["step_times_s"])),
        ("step time (median)", f"{result['step_time_s_median']:.3f} s"),
        ("tokens/s", f"{result['tokens_per_s']:.0f}"),
        *mfu_lines(result),
        ("peak memory", f"{result['peak_memory_gib']:.1f} GiB" if result["peak_memory_gib"] else "n/a"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    out = args.out or RESULTS_DIR / f"rl_step_throughput_{result['preset']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
