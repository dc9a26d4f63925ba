"""Decode attention of the embedded server, one layer, by SDPA backend (GPU).

The captured decode step attends ``--batch`` rows, each one new query per head, to its own slot of
the cache through a ``[B, 1, 1, L]`` mask, with the ``g`` query heads that share a key/value head
laid along the query axis (``inference/server/attention.py``). This times that call on CUDA events
inside a CUDA graph (as the server runs it) for each SDPA backend that accepts it (cuDNN,
memory-efficient, math), with a boolean mask and with an additive one in the model's dtype, plus the
same product written as two batched matmuls and a soft-max (``manual``; with the scores kept in
fp32: ``manual fp32 scores``), and the server's Triton kernel
(``inference/server/decode_kernel.py``) at several block sizes and warp counts, at several KV
lengths. The cache read alone (keys and values once) sets a floor: its bytes over the GPU's memory
bandwidth are printed as ``floor us`` for a rate of 4.0 TB/s.

Prints a table and writes JSON (``benchmarks/results/decode_attention.json``).

Usage::

    python benchmarks/decode_attention.py                      # the Qwen2.5-0.5B shape, batch 256
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from areal_tasks.inference.server.decode_kernel import BLOCK, NUM_WARPS, kernel_available, launch_decode_attention

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
FLOOR_BYTES_PER_S = 4.0e12
#: (keys per loop iteration, warps) of the Triton kernel to time.
TRITON_CONFIGS = ((32, 2), (64, 4), (64, 2), (128, 4), (128, 8))


def manual(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Scores by one batched matmul, masked soft-max in fp32, then the weighted values."""
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * query.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1).to(value.dtype), value)


def manual_fp32_scores(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`manual` with the scores kept in fp32 (``bmm`` with ``out_dtype``, CUDA only): the
    precision of the fused kernels, which round only the probabilities to bf16."""
    batch, heads, group, dim = query.shape
    scores = torch.bmm(
        query.reshape(batch * heads, group, dim),
        key.reshape(batch * heads, -1, dim).transpose(1, 2),
        out_dtype=torch.float32,
    )
    scores = scores.view(batch, heads, group, -1) * dim**-0.5
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(value.dtype)
    return torch.matmul(probs, value)


def time_us(fn, iters: int) -> float:
    """Device microseconds of one ``fn()``: ``iters`` calls captured in one CUDA graph and replayed,
    as the server's decode steps run (timing eager calls would time their launch overhead)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture: cuDNN plans, compiled kernels
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / (3 * iters)


def run(args: argparse.Namespace) -> list[dict]:
    device, dtype = torch.device("cuda"), torch.bfloat16
    group = args.heads // args.kv_heads
    compiled_manual = torch.compile(manual, dynamic=False)
    compiled_fp32 = torch.compile(manual_fp32_scores, dynamic=False)
    rows = []
    for length in args.lengths:
        # a cache of max_len positions per slot, read up to ``length`` (the captured steps' layout)
        store_k = torch.randn(args.batch, args.kv_heads, args.max_len, args.head_dim, device=device, dtype=dtype)
        store_v = torch.randn_like(store_k)
        key, value = store_k[:, :, :length], store_v[:, :, :length]
        query = torch.randn(args.batch, args.kv_heads, group, args.head_dim, device=device, dtype=dtype)
        filled = torch.randint(length // 2, length + 1, (args.batch,), device=device)
        allowed = torch.arange(length, device=device).view(1, 1, 1, -1) < filled.view(-1, 1, 1, 1)
        additive = torch.zeros(allowed.shape, device=device, dtype=dtype).masked_fill(~allowed, float("-inf"))
        floor = 2 * key.numel() * key.element_size() / FLOOR_BYTES_PER_S * 1e6
        reference = manual(query.float(), key.float(), value.float(), allowed)
        cases = [
            (f"{name}, {kind} mask", backend, mask)
            for name, backend in BACKENDS.items()
            for kind, mask in (("bool", allowed), ("additive", additive))
        ]
        with torch.inference_mode():
            for label, backend, mask in cases:

                def call(backend=backend, mask=mask) -> torch.Tensor:
                    with sdpa_kernel([backend]):
                        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)

                try:
                    error = (call().float() - reference).abs().max().item()
                    micros = time_us(call, args.iters)
                except RuntimeError as exc:  # the backend refuses this input
                    rows.append({"kv_len": length, "variant": label, "us": None, "note": str(exc).splitlines()[0][:80]})
                    continue
                rows.append({"kv_len": length, "variant": label, "us": micros, "floor_us": floor, "max_error": error})
            for label, fn in (
                ("manual, eager", manual),
                ("manual, compiled", compiled_manual),
                ("manual fp32 scores, compiled", compiled_fp32),
            ):
                try:
                    error = (fn(query, key, value, allowed).float() - reference).abs().max().item()
                    micros = time_us(lambda fn=fn: fn(query, key, value, allowed), args.iters)
                except RuntimeError as exc:  # e.g. a torch without bmm's out_dtype
                    rows.append({"kv_len": length, "variant": label, "us": None, "note": str(exc).splitlines()[0][:80]})
                    continue
                rows.append({"kv_len": length, "variant": label, "us": micros, "floor_us": floor, "max_error": error})
            if not kernel_available():
                rows.append({"kv_len": length, "variant": "triton", "us": None, "note": "triton does not import"})
                continue
            scale = args.head_dim**-0.5
            for block, warps in TRITON_CONFIGS:
                for kind, mask in (("bool", allowed), ("additive", additive)):
                    label = f"triton {block}x{warps}w, {kind}" + (
                        " (default)" if (block, warps) == (BLOCK, NUM_WARPS) else ""
                    )
                    out = torch.empty_like(query)

                    def kernel(mask=mask, out=out, block=block, warps=warps) -> torch.Tensor:
                        launch_decode_attention(query, key, value, mask, scale, out, block=block, num_warps=warps)
                        return out

                    try:
                        error = (kernel().float() - reference).abs().max().item()
                        micros = time_us(kernel, args.iters)
                    except Exception as exc:  # noqa: BLE001 - a configuration Triton cannot build is reported
                        rows.append(
                            {
                                "kv_len": length,
                                "variant": label,
                                "us": None,
                                "note": f"{type(exc).__name__}: {str(exc).splitlines()[0][:70]}",
                            }
                        )
                        continue
                    rows.append(
                        {"kv_len": length, "variant": label, "us": micros, "floor_us": floor, "max_error": error}
                    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--heads", type=int, default=14)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=4096, help="positions per cache slot")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 4096])
    parser.add_argument("--iters", type=int, default=20, help="calls per captured graph")
    parser.add_argument("--out", default="benchmarks/results/decode_attention.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    rows = run(args)
    print(
        f"decode attention, one layer: batch {args.batch}, {args.heads} query / {args.kv_heads} kv heads, "
        f"head dim {args.head_dim}, bf16 ({torch.cuda.get_device_name()})"
    )
    print(f"{'kv len':>6}  {'variant':<34} {'us':>8} {'floor us':>9} {'max error':>10}")
    for row in rows:
        if row["us"] is None:
            print(f"{row['kv_len']:>6}  {row['variant']:<34} {'refused':>8}  {row['note']}")
            continue
        print(
            f"{row['kv_len']:>6}  {row['variant']:<34} {row['us']:>8.1f} {row['floor_us']:>9.1f} "
            f"{row['max_error']:>10.4f}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {"args": vars(args), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
            indent=1,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
