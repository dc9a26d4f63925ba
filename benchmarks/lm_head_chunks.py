"""The chunked fused LM head by chunk size and chunk kernels: forward + backward time and peak memory.

    python benchmarks/lm_head_chunks.py [--tokens 16384] [--hidden 896] [--vocab 151936] [--repeats 10]
        [--kernels inductor triton] [--powers 25 26 27 28 29]

Runs :func:`areal_tasks.kernels.lm_head.chunked_next_token_stats` (the train engine's LM head)
on ``--tokens`` positions of a bf16 ``--hidden`` x ``--vocab`` head (Qwen2.5-0.5B by default: one
16K-token micro-batch), for chunks of 2**k logits (``--powers``), with and without the entropy, for
each kind of chunk kernels (``--kernels``: ``inductor``, the pure functions through
``torch.compile``; ``triton``, the hand-written kernels of ``lm_head_kernels.py``): the median of
``--repeats`` timed forward+backward passes after two warm-ups, and the peak memory above the
inputs; the engine's chunk size (2**28) once more with the logits kept (``keep_logits``). Checks
that every row gives the same log-probs and gradients as the first (to bf16 rounding). Then each
kind's two kernels alone on one chunk of the engine's size (2**28): median time and the bandwidth
of one read of the logits (forward) or a read and a write (gradient); the Triton forward at a few
launch configurations (:data:`FORWARD_CONFIGS`).
Prints tables and writes ``benchmarks/results/lm_head_chunks.json``. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

from profiling import cuda_median_ms  # benchmarks/ is the script's directory, first on sys.path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lm_head_chunks.json"


def measure(args: argparse.Namespace, elements: int, with_entropy: bool, inputs, keep_logits: bool = False) -> dict:
    import torch

    from areal_tasks.kernels.lm_head import chunked_next_token_stats, default_chunk_size

    hidden, weight, labels = inputs
    chunk = default_chunk_size(args.vocab, elements)

    def step() -> tuple:
        h = hidden.detach().requires_grad_(True)
        w = weight.detach().requires_grad_(True)
        logprob, entropy = chunked_next_token_stats(
            h, w, labels, with_entropy=with_entropy, entropy_grad=with_entropy, chunk=chunk, keep_logits=keep_logits
        )
        loss = logprob.sum() + (entropy.sum() * 0.01 if entropy is not None else 0.0)
        loss.backward()
        return logprob.detach(), h.grad, w.grad

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    return {
        "chunk_elements": elements,
        "chunk_rows": chunk,
        "entropy": with_entropy,
        "keep_logits": keep_logits,
        "ms": statistics.median(times),
        "peak_extra_gib": peak,
        "result": result,
    }


def use_kernels(kind: str) -> None:
    """Make ``kind`` the chunk kernels of the LM head from now on."""
    from areal_tasks.kernels import lm_head

    lm_head._kernels.update(lm_head.eager_kernels())
    if lm_head.compile_chunk_kernels(triton=kind == "triton") != kind:
        raise SystemExit(f"could not select the {kind} chunk kernels")


#: (split, block, warps) of the Triton forward tried by ``time_kernels`` (lm_head_kernels.FORWARD_*).
FORWARD_CONFIGS = [
    (16384, 2048, 4),
    (32768, 4096, 8),
    (32768, 2048, 4),
    (65536, 4096, 8),
    (16384, 4096, 8),
    (32768, 8192, 16),
    (32768, 1024, 2),
    (65536, 2048, 4),
]


def time_kernels(kind: str, args: argparse.Namespace) -> list[dict]:
    """Each chunk kernel alone on one chunk of the engine's size: median ms and TB/s (for Triton,
    the forward at each of :data:`FORWARD_CONFIGS`, the module's own first)."""
    import torch

    from areal_tasks.kernels import lm_head, lm_head_kernels

    rows = lm_head.default_chunk_size(args.vocab, lm_head.COMPILED_CHUNK_ELEMENTS)
    g = torch.Generator(device="cuda").manual_seed(1)
    logits = (torch.randn(rows, args.vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
    labels = torch.randint(0, args.vocab, (rows,), device="cuda", generator=g)
    g_lp, g_ent = torch.randn(rows, device="cuda", generator=g), torch.randn(rows, device="cuda", generator=g)
    log_z, _, entropy = lm_head._kernels["forward"](logits, labels, 1.0, True)
    nbytes = logits.numel() * logits.element_size()
    grad_ms = cuda_median_ms(lambda: lm_head._kernels["grad"](logits, labels, log_z, entropy, g_lp, g_ent, 1.0))
    default = (lm_head_kernels.FORWARD_SPLIT, lm_head_kernels.FORWARD_BLOCK, lm_head_kernels.FORWARD_WARPS)
    configs = [default] + [c for c in FORWARD_CONFIGS if c != default] if kind == "triton" else [None]
    out = []
    for config in configs:
        if config is not None:
            lm_head_kernels.FORWARD_SPLIT, lm_head_kernels.FORWARD_BLOCK, lm_head_kernels.FORWARD_WARPS = config
        forward_ms = cuda_median_ms(lambda: lm_head._kernels["forward"](logits, labels, 1.0, True))
        out.append(
            {
                "kernels": kind,
                "chunk_rows": rows,
                "forward_config": config,
                "forward_ms": forward_ms,
                "forward_tb_s": nbytes / forward_ms / 1e9,
                "grad_ms": grad_ms,
                "grad_tb_s": 2 * nbytes / grad_ms / 1e9,
            }
        )
    if kind == "triton":
        lm_head_kernels.FORWARD_SPLIT, lm_head_kernels.FORWARD_BLOCK, lm_head_kernels.FORWARD_WARPS = default
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--kernels", nargs="+", default=["inductor", "triton"], choices=["inductor", "triton"])
    parser.add_argument(
        "--powers", nargs="+", type=int, default=[25, 26, 27, 28, 29], help="chunk sizes as powers of two of logits"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("lm_head_chunks.py needs CUDA (the chunk kernels are compiled there)")
    sys.path.insert(0, str(ROOT))
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = (
        torch.randn(args.tokens, args.hidden, device="cuda", generator=g, dtype=torch.bfloat16),
        torch.randn(args.vocab, args.hidden, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02,
        torch.randint(0, args.vocab, (args.tokens,), device="cuda", generator=g),
    )
    rows, kernel_rows, references = [], [], {}
    for kind in args.kernels:
        use_kernels(kind)
        for with_entropy in (False, True):
            # the engine's chunk size once more with the logits kept (one matmul each way, the
            # gradient written over them)
            for power, keep in [(power, False) for power in args.powers] + [(28, True)]:
                row = {"kernels": kind, **measure(args, 2**power, with_entropy, inputs, keep)}
                result = row.pop("result")
                reference = references.setdefault(with_entropy, result)
                row["max_logprob_diff"] = float((result[0] - reference[0]).abs().max())
                row["max_grad_h_rel"] = float(
                    (result[1].float() - reference[1].float()).norm() / reference[1].float().norm()
                )
                rows.append(row)
        kernel_rows.extend(time_kernels(kind, args))
    print(
        f"{'kernels':>8} {'entropy':>7} {'kept':>5} {'chunk 2^k':>9} {'rows':>6} {'fwd+bwd ms':>10} {'peak GiB':>8} "
        f"{'d logprob':>9} {'d grad_h':>9}"
    )
    for row in rows:
        print(
            f"{row['kernels']:>8} {row['entropy']!s:>7} {row['keep_logits']!s:>5} "
            f"{row['chunk_elements'].bit_length() - 1:>9} "
            f"{row['chunk_rows']:>6} {row['ms']:>10.2f} {row['peak_extra_gib']:>8.2f} "
            f"{row['max_logprob_diff']:>9.1e} {row['max_grad_h_rel']:>9.1e}"
        )
    print(f"\none chunk of {kernel_rows[0]['chunk_rows']} rows, each kernel alone")
    print(
        f"{'kernels':>8} {'forward (split, block, warps)':>29} {'forward ms':>10} {'TB/s':>6} {'grad ms':>8} "
        f"{'TB/s':>6}"
    )
    for row in kernel_rows:
        config = "-" if row["forward_config"] is None else str(tuple(row["forward_config"]))
        print(
            f"{row['kernels']:>8} {config:>29} {row['forward_ms']:>10.3f} {row['forward_tb_s']:>6.2f} "
            f"{row['grad_ms']:>8.3f} {row['grad_tb_s']:>6.2f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "lm_head_chunks",
                "tokens": args.tokens,
                "hidden": args.hidden,
                "vocab": args.vocab,
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "host": platform.node(),
                "rows": rows,
                "kernels_alone": kernel_rows,
            },
            indent=2,
        )
    )
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
