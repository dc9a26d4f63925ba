"""Train throughput of the FSDP2 engine: tokens/s and MFU on packed micro-batches.

A randomly initialised model of the chosen shape (``qwen2.5-0.5b``: hidden 896, 24 layers, 14 heads,
2 KV heads, intermediate 4864, vocab 151936, tied embeddings; ``tiny`` for a CPU smoke run) trains
on batches of long-tailed sequence lengths (lognormal, clipped to ``[32, tokens_per_mb]``, as RL
rollouts produce) packed into micro-batches of at most ``--tokens-per-mb`` tokens. A batch holds
``--mbs-per-step`` micro-batches' worth of tokens; the sequences that the engine's packing would put
in a further, nearly empty micro-batch (a long-tail mix never packs exactly) are left out, so a step
runs exactly ``--mbs-per-step`` micro-batches (``--spill`` keeps them: a nearly empty micro-batch
a step, as every run before the eighth session had). After
``--warmup`` steps, ``--steps`` timed ``train_batch`` calls (forward, backward, clipping, AdamW)
are measured, back to back as a training loop runs them: each step is submitted
(``engine.submit_train_batch``) before the previous step's stats are read, and a step's time runs
from one read-back to the next, so the times add up to the whole window. ``--sync-every-step``
times each step between two device synchronisations instead (the measurement before the tenth
session: it includes the host's ramp at every step's start, while the device has nothing queued).

MFU = (6 * params * tokens + attention FLOPs) / step time / peak FLOP/s per GPU, against two peaks
(``mfu.py``): the measured bf16 matmul rate (``mfu``: ``--peak-flops``, default 795e12, measured on
an H200; every earlier JSON's figure) and the vendor's dense bf16 spec (``mfu_spec``: 989 TFLOP/s
for an H200, looked up by device name; ``--peak-tflops`` for a GPU the table lacks). Attention
FLOPs count the causal score and value matmuls of every sequence: ``6 * layers * heads * head_dim
* sum(L^2)`` for forward + backward (``2 L^2 H d`` forward, half of the full square, three times for
the backward). Recomputation under gradient checkpointing is not counted (that would be hardware
FLOPs utilisation).

Prints a table and writes JSON (``benchmarks/results/train_throughput_<preset>_dp<d>sp<s>tp<t>.json``
by default), both naming the attention and LM-head paths the engine ran (``engine.kernels``: e.g.
``areal_varlen`` attention, the chunked fused LM head). ``--attn-implementation sdpa`` and
``--no-chunked-head`` select the previous paths for comparison. ``--profile`` profiles the
warm-up's last two batches again, back to back (one step with ``--sync-every-step``): the
costliest operators by device and by host time, and the GPU-busy fraction (union of the device
kernels' intervals over the profiled span; the rest is the device waiting for the host).

``--compile off`` runs the element-wise work eagerly (``EngineConfig.compile``; ``auto`` compiles
on CUDA). The current figures, one H200 and two, with their commands: ``docs/benchmarks.md``
("Train throughput and MFU (H200)"; ``bash benchmarks/gpu_suite.sh train`` runs the engine's
defaults: no FSDP, eight blocks a compiled graph and the LM head's logits kept, all by ``auto``);
what each change bought: ``docs/benchmarks_history.md``. With
``--profile`` the JSON also records where the device waited (``profile.idle``: before the first
kernel, after the last, by gap length and by tenth of the step).

Usage::

    python benchmarks/train_throughput.py --preset tiny                       # CPU, seconds
    python benchmarks/train_throughput.py --preset qwen2.5-0.5b               # one GPU
    torchrun --nproc-per-node 2 benchmarks/train_throughput.py --sp 2         # several GPUs
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from mfu import MEASURED_PEAK_FLOPS, mfu_fields, mfu_lines, spec_peak  # benchmarks/ is first on sys.path
from train_batches import fill_micro_batches, long_tail_batch, pg_loss, step_flops, token_weight
from train_profile import _allocator_counts, _dynamo_counts, _profile_step
from train_timing import _freeze_gc, _sync, _timed_pipelined, _timed_synced

from areal_tasks.config.engine import EngineConfig, OptimizerConfig
from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.fsdp.engine import FSDPEngine
from areal_tasks.engine.microbatch import split_into_micro_batches
from areal_tasks.engine.parallel.mesh import ParallelDims

logger = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"

PRESETS = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "tokens_per_mb": 16384,
    },
    "tiny": {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1024,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "tokens_per_mb": 512,
    },
}


def build_model_dir(preset: str, root: Path) -> tuple[Path, dict]:
    """Write a randomly initialised Qwen2 model of the preset's shape (rank 0) and return its directory."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = {k: v for k, v in PRESETS[preset].items() if k != "tokens_per_mb"}
    path = root / preset
    if dist.get_rank() == 0:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape), dtype=torch.float32)
        model.save_pretrained(str(path))
    dist.barrier()
    return path, shape


def _init_distributed() -> None:
    """``env://`` under torchrun, else a world of one."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        store = Path(tempfile.mkdtemp(prefix="areal_bench_pg_")) / "store"
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)


def _blocks_per_graph(text: str) -> int | str:
    """``--compile-blocks-per-graph``: ``auto`` or a positive integer."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected auto or an integer >= 1, got {text!r}")
    return value


def run(args: argparse.Namespace) -> dict:
    _init_distributed()
    world = dist.get_world_size()
    model_dir, shape = build_model_dir(args.preset, Path(args.model_root))
    tokens_per_mb = args.tokens_per_mb or PRESETS[args.preset]["tokens_per_mb"]
    cfg = EngineConfig(
        optimizer=OptimizerConfig(lr=1e-6, grad_clip=1.0),
        micro_batch=MicroBatchSpec(n_mbs=1, max_tokens_per_mb=tokens_per_mb),
        gradient_checkpointing=args.gradient_checkpointing,
        dtype=args.dtype,
        compile=args.compile,
        compile_scope=args.compile_scope,
        compile_blocks_per_graph=args.compile_blocks_per_graph,
        fsdp_wrap=args.fsdp_wrap,
        lm_head_keep_logits={"on": True, "off": False}.get(args.lm_head_keep_logits, "auto"),
    )
    engine = FSDPEngine(
        cfg,
        str(model_dir),
        parallel=ParallelDims.for_world(world, sp=args.sp, tp=args.tp),
        total_steps=args.warmup + args.steps,
        attn_implementation=args.attn_implementation,
        chunked_lm_head=not args.no_chunked_head,
    )
    engine.initialize()
    info = engine.parallel
    kernels = engine.kernels
    n_params = sum(p.numel() for p in engine.model.parameters())  # DTensor numel is the global size
    batches = [
        long_tail_batch(
            args.mbs_per_step * tokens_per_mb, tokens_per_mb, shape["vocab_size"], seed=1000 * step + info.dp_rank
        )
        for step in range(args.warmup + args.steps)
    ]
    if not args.spill:
        batches = [fill_micro_batches(b, cfg.micro_batch, args.mbs_per_step) for b in batches]
    mbs_run = [split_into_micro_batches(b, cfg.micro_batch).n_micro_batches for b in batches[args.warmup :]]
    for _step, batch in enumerate(batches[: args.warmup]):
        engine.train_batch(batch, pg_loss, token_weight)
    _sync()
    graphs_after_warmup = _dynamo_counts()["unique_graphs"]
    if args.freeze_gc:
        _freeze_gc()
    if args.profile:  # the warm-up's last batches again: one step, or two back to back as timed
        last = max(args.warmup, 1)
        profiled = batches[last - 1 : last] if args.sync_every_step else batches[max(last - 2, 0) : last]
        profile_summary = _profile_step(engine, profiled)
    else:
        profile_summary = None
    timed = batches[args.warmup :]
    allocator_before = _allocator_counts()
    if args.sync_every_step:
        times, results = _timed_synced(engine, timed)
    else:
        times, results = _timed_pipelined(engine, timed)
    tokens = [stats["n_tokens"] for stats in results]
    flops = []
    for batch in timed:
        step_fl = torch.tensor(
            [step_flops(batch, n_params, shape) if info.is_dp_head else 0.0], dtype=torch.float64, device=engine.device
        )
        dist.all_reduce(step_fl)
        flops.append(float(step_fl))
    allocator_calls = {k: v - allocator_before[k] for k, v in _allocator_counts().items()}
    if args.freeze_gc:
        gc.enable()
        gc.unfreeze()
    gpus = world
    tokens_per_s = sum(tokens) / sum(times)
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    mfu = mfu_fields(sum(flops), sum(times), gpus, args.peak_flops, spec_peak(device_name, args.peak_tflops))
    result = {
        "preset": args.preset,
        "shape": shape,
        "params": n_params,
        "world_size": world,
        "dp": info.dp_size,
        "sp": info.sp_size,
        "tp": info.tp_size,
        "dtype": args.dtype,
        "tokens_per_mb": tokens_per_mb,
        "mbs_per_step": args.mbs_per_step,
        "gradient_checkpointing": args.gradient_checkpointing,
        "steps": args.steps,
        "step_time_s_median": statistics.median(times),
        "tokens_per_step": statistics.mean(tokens),
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / gpus,
        **mfu,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "device": device_name,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "attn_implementation": kernels["attention"],
        "lm_head": kernels["lm_head"],
        "compile": kernels["compile"],
        "fsdp_wrap": kernels["fsdp_wrap"],
        "compile_blocks_per_graph": engine.blocks_per_graph,
        "lm_head_keep_logits": engine.lm_head is not None and engine.lm_head.keep_logits,
        "settings": {
            "compile_blocks_per_graph": args.compile_blocks_per_graph,
            "lm_head_keep_logits": args.lm_head_keep_logits,
        },
        "step_times_s": times,
        "timing": "each step synchronised"
        if args.sync_every_step
        else "pipelined: step k's stats read after step k+1 is submitted",
        "micro_batches_per_step": mbs_run,
        "spill": args.spill,
        "gc": "frozen and off after the warm-up" if args.freeze_gc else "default",
        "allocator_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "allocator_calls_in_timed_steps": allocator_calls,
        "dynamo": {
            **_dynamo_counts(),
            "graphs_compiled_in_timed_steps": _dynamo_counts()["unique_graphs"] - graphs_after_warmup,
        },
        "profile": profile_summary,
    }
    engine.destroy()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--tokens-per-mb", type=int, default=None, help="token cap of a micro-batch (preset default)")
    parser.add_argument("--mbs-per-step", type=int, default=2, help="micro-batches' worth of tokens per step and rank")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sp", type=int, default=1)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument(
        "--attn-implementation",
        default=None,
        help="override the engine's choice (e.g. sdpa, the block-mask path; areal_varlen)",
    )
    parser.add_argument(
        "--no-chunked-head",
        action="store_true",
        help="materialise the full logits instead of the chunked fused LM head",
    )
    parser.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="torch.compile the element-wise work (EngineConfig.compile; auto = on CUDA)",
    )
    parser.add_argument(
        "--compile-scope",
        default="auto",
        choices=["auto", "blocks", "pointwise"],
        help="what is compiled (EngineConfig.compile_scope): whole decoder blocks, or only "
        "their norms and MLPs; auto = whole blocks with the engine's varlen attention",
    )
    parser.add_argument(
        "--compile-blocks-per-graph",
        type=_blocks_per_graph,
        default="auto",
        help="consecutive decoder blocks a compiled graph runs (EngineConfig.compile_blocks_per_graph; "
        "more than 1 needs the model as one FSDP unit or none; auto = up to 8 where it can)",
    )
    parser.add_argument(
        "--lm-head-keep-logits",
        nargs="?",
        const="on",
        default="auto",
        choices=["auto", "on", "off"],
        help="the chunked LM head keeps the logits for the backward instead of recomputing them "
        "(EngineConfig.lm_head_keep_logits; the flag alone = on; auto = where the token cap's "
        "logits take at most 5%% of the GPU)",
    )
    parser.add_argument(
        "--fsdp-wrap",
        default="auto",
        choices=["auto", "block", "root", "none"],
        help="FSDP2 units (EngineConfig.fsdp_wrap; auto = the whole model with one rank per "
        "shard group, one unit per decoder block otherwise; none = no FSDP on one rank)",
    )
    parser.add_argument(
        "--spill",
        action="store_true",
        help="keep every generated sequence, even those that spill into a nearly empty extra "
        "micro-batch (the setting of the runs before the eighth session)",
    )
    parser.add_argument(
        "--freeze-gc",
        action="store_true",
        help="after the warm-up, collect once, gc.freeze() and gc.disable() (Python's garbage "
        "collector cannot pause a timed or profiled step)",
    )
    parser.add_argument(
        "--sync-every-step",
        action="store_true",
        help="time each step on its own, between two device synchronisations (the measurement "
        "before the tenth session); by default the timed steps run back to back, each "
        "step's stats read after the next step is submitted, as the SFT loop does",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile extra steps on the warm-up's last batches (two back to back, or one with "
        "--sync-every-step): the top operators, the GPU-busy fraction, device time by kind per "
        "step and every host-device synchronisation with the Python line that caused it",
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=MEASURED_PEAK_FLOPS,
        help="measured bf16 matmul FLOP/s of one device (the MFU every JSON's 'mfu' has used; 795e12: an H200)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="spec (vendor) dense bf16 TFLOP/s of one device for 'mfu_spec' (default: benchmarks/mfu.py's "
        "table by device name, 989 for an H200)",
    )
    parser.add_argument(
        "--model-root",
        default=str(Path(tempfile.gettempdir()) / "areal_bench_models"),
        help="where rank 0 writes the random model (a folder every rank can read)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default results/train_throughput_<preset>_dp<d>sp<s>tp<t>.json)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    if dist.get_rank() == 0:
        rows = [
            ("preset", result["preset"]),
            ("device", result["device"]),
            ("world (dp/sp/tp)", f"{result['world_size']} ({result['dp']}/{result['sp']}/{result['tp']})"),
            ("params", f"{result['params'] / 1e6:.1f} M"),
            ("attention", result["attn_implementation"]),
            ("LM head", result["lm_head"]),
            ("compile", result["compile"]),
            ("FSDP units", result["fsdp_wrap"]),
            (
                "graphs / graph breaks",
                f"{result['dynamo']['unique_graphs']} / {result['dynamo']['graph_breaks']}"
                f" ({result['dynamo']['graphs_compiled_in_timed_steps']} compiled in the timed steps)",
            ),
            ("step times", " ".join(f"{t:.3f}" for t in result["step_times_s"])),
            ("tokens/step", f"{result['tokens_per_step']:.0f}"),
            (
                "micro-batches/step",
                " ".join(str(n) for n in result["micro_batches_per_step"]) + (" (spilled)" if result["spill"] else ""),
            ),
            (
                "allocator in timed steps",
                "cudaMalloc {num_device_alloc}, cudaFree {num_device_free}, retries {num_alloc_retries}".format(
                    **result["allocator_calls_in_timed_steps"]
                ),
            ),
            ("step time (median)", f"{result['step_time_s_median']:.3f} s"),
            ("tokens/s", f"{result['tokens_per_s']:.0f}"),
            *mfu_lines(result),
            ("peak memory", f"{result['peak_memory_gib']:.1f} GiB" if result["peak_memory_gib"] else "n/a"),
        ]
        if result["profile"]:
            rows.append(("GPU busy (profiled)", f"{100 * result['profile']['gpu_busy_fraction']:.1f} %"))
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")
        out = args.out or RESULTS_DIR / (
            f"train_throughput_{result['preset']}_dp{result['dp']}sp{result['sp']}tp{result['tp']}"
            f"{'' if args.fsdp_wrap == 'auto' else '_' + args.fsdp_wrap}"
            f"{'' if args.compile_scope == 'auto' else '_' + args.compile_scope}"
            f"{'' if args.compile_blocks_per_graph == 'auto' else f'_{args.compile_blocks_per_graph}blocks'}"
            f"{ {'auto': '', 'on': '_kept_logits', 'off': '_recomputed_logits'}[args.lm_head_keep_logits] }"
            f"{'_' + args.attn_implementation if args.attn_implementation else ''}"
            f"{'_spill' if args.spill else ''}"
            f"{'_frozen_gc' if args.freeze_gc else ''}"
            f"{'_synced' if args.sync_every_step else ''}.json"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
