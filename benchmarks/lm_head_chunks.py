"""The chunked fused LM head's chunk size: forward + backward time and peak memory per size.

    python benchmarks/lm_head_chunks.py [--tokens 16384] [--hidden 896] [--vocab 151936] [--repeats 10]

Runs :func:`areal_tasks.engine.fsdp.lm_head.chunked_next_token_stats` (the train engine's LM head;
its element-wise chunk work compiled on CUDA, as the engine does) on ``--tokens`` positions of a
bf16 ``--hidden`` x ``--vocab`` head (Qwen2.5-0.5B by default: one 16K-token micro-batch), for
chunks of 2**25 .. 2**29 logits, with and without the entropy; the median of ``--repeats`` timed
forward+backward passes after two warm-ups, and the peak memory above the inputs. Checks that every
chunk size gives the same log-probs and gradients as the first (to bf16 rounding). Prints a table
and writes ``benchmarks/results/lm_head_chunks.json``. CUDA only.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "lm_head_chunks.json"


def measure(args: argparse.Namespace, elements: int, with_entropy: bool, inputs) -> dict:
    import torch

    from areal_tasks.engine.fsdp.lm_head import chunked_next_token_stats, default_chunk_size

    hidden, weight, labels = inputs
    chunk = default_chunk_size(args.vocab, elements)

    def step() -> tuple:
        h = hidden.detach().requires_grad_(True)
        w = weight.detach().requires_grad_(True)
        logprob, entropy = chunked_next_token_stats(h, w, labels, with_entropy=with_entropy,
                                                    entropy_grad=with_entropy, chunk=chunk)  # fmt: skip
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
    return {"chunk_elements": elements, "chunk_rows": chunk, "entropy": with_entropy,
            "ms": statistics.median(times), "peak_extra_gib": peak, "result": result}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("lm_head_chunks.py needs CUDA (the chunk kernels are compiled there)")
    sys.path.insert(0, str(ROOT))
    from areal_tasks.engine.fsdp.lm_head import compile_chunk_kernels

    compile_chunk_kernels()
    g = torch.Generator(device="cuda").manual_seed(0)
    inputs = (torch.randn(args.tokens, args.hidden, device="cuda", generator=g, dtype=torch.bfloat16),
              torch.randn(args.vocab, args.hidden, device="cuda", generator=g, dtype=torch.bfloat16) * 0.02,
              torch.randint(0, args.vocab, (args.tokens,), device="cuda", generator=g))  # fmt: skip
    rows = []
    for with_entropy in (False, True):
        reference = None
        for power in range(25, 30):
            row = measure(args, 2**power, with_entropy, inputs)
            result = row.pop("result")
            if reference is None:
                reference = result
            row["max_logprob_diff"] = float((result[0] - reference[0]).abs().max())
            row["max_grad_h_rel"] = float((result[1].float() - reference[1].float()).norm()
                                          / reference[1].float().norm())  # fmt: skip
            rows.append(row)
    print(f"{'entropy':>7} {'chunk 2^k':>9} {'rows':>6} {'fwd+bwd ms':>10} {'peak GiB':>8} {'d logprob':>9} {'d grad_h':>9}")
    for row in rows:
        print(f"{str(row['entropy']):>7} {row['chunk_elements'].bit_length() - 1:>9} {row['chunk_rows']:>6} "
              f"{row['ms']:>10.2f} {row['peak_extra_gib']:>8.2f} {row['max_logprob_diff']:>9.1e} "
              f"{row['max_grad_h_rel']:>9.1e}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "lm_head_chunks", "tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "host": platform.node(), "rows": rows,
    }, indent=2))  # fmt: skip
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
