"""Varlen attention on packed micro-batches: torch's flash kernel (the engine's ``areal_varlen`` on
CUDA), forward and forward+backward, by length mix.

The layer is the Qwen2.5-0.5B shape's (14 query heads, 2 key/value heads, head dimension 64, bf16).
Length mixes: the train benchmark's long-tail micro-batch of 16K tokens (the first of its first
step's two), the same tokens as 4 sequences of 4,096, and 64 sequences of 256. For each the
median of ``--iters`` timed calls (CUDA events), the attention TFLOP/s (causal: ``2 x 2 x H x D x
sum(L^2) / 2`` forward, 2.5 times that backward), and the largest difference of the output from an
fp32 per-sequence reference. Short sequences run far below the kernel's peak: the cost per token
has a floor that long sequences amortise. Kernels: ``flash`` (the key/value heads repeated up to
the query heads first), ``flash_gqa`` (the engine's path: on a torch without ``enable_gqa`` the
grouped heads go to the flash kernels as they are, ``kernels/flash_gqa.py``) and ``flex``
(FlexAttention with a document-causal block mask; the time to build the mask is its own column).

The eighth session also timed cuDNN's fused attention over ragged sequences here (commit
``f531263``, ``benchmarks/results/varlen_attention_cudnn.json``): torch 2.11's
``_cudnn_attention_forward`` with ``cum_seq_q`` gave the right output but ran orders of magnitude
slower than the flash kernel, and its backward returned wrong gradients (NaN and 1e18 values), so
it was dropped (docs/benchmarks_history.md, "Train throughput", eighth session); torch's own
``varlen_attn`` keeps its cuDNN branch switched off too.

Prints a table and writes ``benchmarks/results/varlen_attention.json``. Needs CUDA.

Usage::

    python benchmarks/varlen_attention.py [--iters 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profiling import cuda_median_ms
from train_batches import fill_micro_batches, long_tail_batch

from areal_tasks.config.micro_batch import MicroBatchSpec
from areal_tasks.engine.microbatch import split_into_micro_batches
from areal_tasks.kernels.attention import repeat_heads, varlen_packed

RESULTS = Path(__file__).resolve().parent / "results" / "varlen_attention.json"
HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64


def length_mixes(tokens: int) -> dict[str, list[int]]:
    spec = MicroBatchSpec(n_mbs=1, max_tokens_per_mb=tokens)
    batch = fill_micro_batches(long_tail_batch(2 * tokens, tokens, 1000, seed=0), spec, 2)
    cu = split_into_micro_batches(batch, spec).micro_batches[0]["cu_seqlens"]
    long_tail = (cu[1:] - cu[:-1]).tolist()
    return {"long-tail 16K": long_tail, "4 x 4096": [tokens // 4] * 4, "64 x 256": [tokens // 64] * 64}


def attention_flops(lengths: list[int]) -> float:
    """Forward FLOPs of causal attention (score and value matmuls, half the square)."""
    return 2 * 2 * HEADS * HEAD_DIM * sum(n * n for n in lengths) / 2


def _reference(q, k, v, lengths, scale):
    outs, start = [], 0
    for n in lengths:
        qs, ks, vs = (t[start : start + n].float().transpose(0, 1) for t in (q, k, v))
        rep = HEADS // KV_HEADS
        outs.append(
            torch.nn.functional.scaled_dot_product_attention(
                qs, ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0), is_causal=True, scale=scale
            ).transpose(0, 1)
        )
        start += n
    return torch.cat(outs)


def _flex_kernel(lengths: list[int], scale: float):
    """FlexAttention (Triton, compiled) over the whole packed row with a document-causal block mask
    (blocks outside every sequence are skipped), native GQA; returns (call, mask build ms)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    device = torch.device("cuda")
    total = sum(lengths)
    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))

    def document_causal(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    build = lambda: create_block_mask(document_causal, None, None, total, total, device=device)  # noqa: E731
    mask = build()
    mask_ms = cuda_median_ms(build, 5, warmup=1)
    flex = torch.compile(flex_attention, dynamic=False)

    def call(q, k, v):
        out = flex(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            block_mask=mask,
            scale=scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)

    return call, mask_ms


def run_mix(name: str, lengths: list[int], iters: int) -> list[dict]:
    device = torch.device("cuda")
    total, scale = sum(lengths), HEAD_DIM**-0.5
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(total, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(total, KV_HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    grad = torch.randn(total, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    max_len = max(lengths)
    rep = HEADS // KV_HEADS
    kernels = {  # flash: the key/value heads repeated first; flash_gqa: the engine's path, grouped heads as they are
        "flash": lambda a, b, c: varlen_packed(
            a, repeat_heads(b, rep), repeat_heads(c, rep), cu, max_len, scaling=scale
        ),
        "flash_gqa": lambda a, b, c: varlen_packed(a, b, c, cu, max_len, scaling=scale),
    }
    extra: dict[str, dict] = {}
    results = []
    try:
        kernels["flex"], mask_ms = _flex_kernel(lengths, scale)
        extra["flex"] = {"mask_build_ms": mask_ms}
    except Exception as exc:  # noqa: BLE001  (recorded in the table and the JSON, not hidden)
        results.append(
            {
                "mix": name,
                "kernel": "flex",
                "tokens": total,
                "sequences": len(lengths),
                "error": f"{type(exc).__name__}: {exc}"[:400],
            }
        )
    reference = _reference(q, k, v, lengths, scale)
    fwd_flops = attention_flops(lengths)
    flash_grads = None
    for kernel, fn in kernels.items():
        row = {
            "mix": name,
            "kernel": kernel,
            "tokens": total,
            "sequences": len(lengths),
            "max_len": max_len,
            **extra.get(kernel, {}),
        }
        try:
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = fn(*leaves)
            grads = torch.autograd.grad(out, leaves, grad)
            with torch.no_grad():
                row["forward_ms"] = cuda_median_ms(lambda: fn(q, k, v), iters, warmup=2)

            def forward_backward():
                ls = [t.detach().requires_grad_() for t in (q, k, v)]
                torch.autograd.grad(fn(*ls), ls, grad)

            row["forward_backward_ms"] = cuda_median_ms(forward_backward, iters, warmup=2)
            row["forward_tflops"] = fwd_flops / row["forward_ms"] / 1e9
            row["forward_backward_tflops"] = 3.5 * fwd_flops / row["forward_backward_ms"] / 1e9
            row["max_abs_diff_vs_fp32"] = float((out.detach().float() - reference).abs().max())
            row["grad_norms"] = [float(g.float().norm()) for g in grads]
            if kernel == "flash":
                flash_grads = grads
            elif flash_grads is not None:
                row["max_grad_diff_vs_flash"] = max(
                    float((g.float() - f.float()).abs().max()) for g, f in zip(grads, flash_grads)
                )
        except Exception as exc:  # noqa: BLE001  (recorded in the table and the JSON, not hidden)
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        results.append(row)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("varlen_attention.py needs CUDA (it times GPU kernels)")
    rows = [row for name, lengths in length_mixes(args.tokens).items() for row in run_mix(name, lengths, args.iters)]
    print(
        f"{'mix':<14} {'kernel':<9} {'seqs':>5} {'fwd ms':>8} {'TFLOP/s':>8} {'f+b ms':>8} {'TFLOP/s':>8} "
        f"{'vs fp32':>8} {'mask ms':>8}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['mix']:<14} {r['kernel']:<9} {r['sequences']:>5}  {r['error']}")
            continue
        mask = f"{r['mask_build_ms']:>8.3f}" if "mask_build_ms" in r else f"{'-':>8}"
        print(
            f"{r['mix']:<14} {r['kernel']:<9} {r['sequences']:>5} {r['forward_ms']:>8.3f} {r['forward_tflops']:>8.1f} "
            f"{r['forward_backward_ms']:>8.3f} {r['forward_backward_tflops']:>8.1f} "
            f"{r['max_abs_diff_vs_fp32']:>8.4f} {mask}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "heads": HEADS,
                "kv_heads": KV_HEADS,
                "head_dim": HEAD_DIM,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
