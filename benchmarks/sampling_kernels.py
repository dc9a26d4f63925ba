"""The embedded server's sampled step: sort-based vs sort-free top-k / top-p draws (GPU).

One draw of a ``--batch`` x ``--vocab`` bf16 logits matrix (the Qwen2.5 vocabulary, batch 256 by
default), temperature 1, each setting of ``--settings`` (``top_p=0.9``, ``top_k=50``), timed on
CUDA events inside a CUDA graph (``--iters`` draws captured in one graph, replayed 3 times), as the
server's decode steps run:

* ``sort``: the server's sampler before issue #33 (``sampling_kernels.sorted_draw``: a
  segmented sort of every row, a cumulative sum, masks over sorted ranks), eager;
* ``sort-free, eager, fan-out F``: :func:`~areal_tasks.inference.server.sampling_kernels.draw_rows`
  (the threshold search over order keys, fixed rounds, ``F - 1`` points a round), eager (the
  server's eager runners use ``F = 2``);
* ``sort-free, compiled, fan-out F``: the same through ``torch.compile`` (what the CUDA-graph
  runner used before the Triton kernel: ``GreedyPicker.draw``, ``F = 4``);
* ``triton, block B/S, fan-out F, W warps``: the one-launch kernel of ``sampling_triton.py`` (what
  every CUDA runner uses where Triton is present), one configuration per ``--triton-configs`` entry.

``--settings`` also takes ``none`` (temperature 1, no filter).

A variant that fails (a compilation error, say) is reported with its error and the others still
run.

Each row also checks the draw: the share of rows whose sampled token the sorted filter keeps
(ties on the threshold value aside: 1.0). Prints a table and writes JSON
(``benchmarks/results/sampling_kernels.json``).

Usage::

    python benchmarks/sampling_kernels.py                 # one GPU, batch 256 x 151,936
    python benchmarks/sampling_kernels.py --device cpu --batch 4 --vocab 4096 --iters 2   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from areal_tasks.inference.server.sampling import TOP_K_ALL
from areal_tasks.inference.server.sampling_kernels import draw_rows, order_keys, sorted_draw, sorted_filter
from areal_tasks.inference.server.sampling_triton import kernel_available, triton_draw

Draw = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def time_ms(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    """Milliseconds of one ``fn()``: on CUDA, ``iters`` calls captured in one graph and replayed;
    on CPU (smoke runs), the median of ``iters`` calls."""
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * statistics.median(times)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()  # warm-up outside the capture: compiled kernels, allocator
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
    return start.elapsed_time(end) / (3 * iters)


def _compiled(fan_out: int, compiled: bool = True) -> Draw:
    """:func:`draw_rows` with ``fan_out``, through ``torch.compile`` (static shapes) if ``compiled``."""
    fn = torch.compile(draw_rows, dynamic=False) if compiled else draw_rows

    def draw(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return fn(*args, fan_out=fan_out)

    return draw


def _triton(config: str, seeds: torch.Tensor, setting: str) -> Draw:
    """:func:`triton_draw` with ``config`` ("BLOCK,SEARCH_BLOCK,FAN_OUT,WARPS") and fixed per-row
    ``seeds`` (the uniform numbers the other variants take are ignored), specialised for ``setting``
    as the server specialises it for a batch (counts only for top-k, masses only for top-p, no
    search without either)."""
    block, search_block, fan_out, warps = (int(v) for v in config.split(","))
    top_k, top_p = setting.startswith("top_k"), setting.startswith("top_p")

    def draw(logits: torch.Tensor, *table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        *settings_, _uniforms = table
        return triton_draw(
            logits,
            *settings_,
            seeds,
            top_k or top_p,
            top_k,
            top_p,
            block=block,
            fan_out=fan_out,
            search_block=search_block,
            num_warps=warps,
        )

    return draw


def _triton_label(config: str) -> str:
    block, search_block, fan_out, warps = config.split(",")
    return f"triton, block {block}/{search_block}, fan-out {fan_out}, {warps} warps"


def settings(name: str, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(temperatures, top_ks, top_ps, min_ps, greedy) for ``top_p=X``, ``top_k=N`` or ``none`` at
    temperature 1."""
    key, _, value = name.partition("=")
    top_k = int(value) if key == "top_k" else TOP_K_ALL
    top_p = float(value) if key == "top_p" else 1.0
    if key not in ("top_k", "top_p", "none"):
        raise SystemExit(f"--settings takes top_p=X, top_k=N or none, got {name!r}")
    return (
        torch.ones(rows, device=device),
        torch.full((rows,), top_k, dtype=torch.long, device=device),
        torch.full((rows,), top_p, device=device),
        torch.zeros(rows, device=device),
        torch.zeros(rows, dtype=torch.bool, device=device),
    )


def kept_share(logits: torch.Tensor, tokens: torch.Tensor, table: tuple[torch.Tensor, ...]) -> float:
    """Share of rows whose token the sorted filter keeps (weight > 0 at the token), a token equal
    in value to the filter's last kept one counting as kept: where the threshold falls inside a run
    of equal logits (common in bf16: a top-p cut in the tail splits runs of hundreds), the sort keeps
    the first of them in its own order and the kernel the lowest indices, as many and the same mass."""
    temperatures, top_ks, top_ps, min_ps, _ = table
    probs = torch.softmax(logits.float() / temperatures.view(-1, 1), dim=-1)
    weights, ids = sorted_filter(probs, top_ks, top_ps, min_ps)
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, ids, weights > 0)
    keys = order_keys(logits)
    last_kept = torch.where(kept, keys, torch.iinfo(keys.dtype).max).min(dim=1, keepdim=True).values
    kept |= keys == last_kept
    return kept.gather(1, tokens.view(-1, 1)).float().mean().item()


def run(args: argparse.Namespace) -> list[dict]:
    device = torch.device(args.device)
    gen = torch.Generator(device=device).manual_seed(0)
    # logits shaped like a language model's: a few strong tokens over a broad low tail
    logits = torch.randn(args.batch, args.vocab, device=device, generator=gen) * 2.0
    logits[:, : args.vocab // 100] += 6.0 * torch.rand(args.batch, args.vocab // 100, device=device, generator=gen)
    logits = logits.to(torch.bfloat16)
    uniforms = torch.rand(args.batch, device=device, generator=gen)
    variants: list[tuple[str, Draw]] = [("sort", sorted_draw)]
    variants += [(f"sort-free, eager, fan-out {f}", _compiled(f, compiled=False)) for f in args.eager_fan_outs]
    if not args.no_compile:
        variants += [(f"sort-free, compiled, fan-out {f}", _compiled(f)) for f in args.fan_outs]
    seeds = torch.randint(0, 2**62, (args.batch,), device=device, generator=gen)
    triton_configs = args.triton_configs if device.type == "cuda" and kernel_available() else []
    rows = []
    print(f"{'setting':<10} {'variant':<42} {'ms/step':>8} {'vs sort':>8} {'first call s':>12} {'kept':>6}")
    with torch.inference_mode():
        for name in args.settings:
            table = settings(name, args.batch, device)
            tritons = [(_triton_label(c), _triton(c, seeds, name)) for c in triton_configs]
            for label, fn in [*variants, *tritons]:
                row = {"setting": name, "variant": label}
                try:
                    start = time.perf_counter()
                    tokens, _ = fn(logits, *table, uniforms)  # first call: compiles where compiled
                    row["first_call_s"] = time.perf_counter() - start
                    row["ms"] = time_ms(lambda fn=fn, table=table: fn(logits, *table, uniforms), args.iters, device)
                except RuntimeError as exc:  # reported in the table and the JSON, then the next variant
                    row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                    print(f"{name:<10} {label:<42} failed: {row['error']}")
                    rows.append(row)
                    continue
                row["kept_share"] = kept_share(logits, tokens, table)
                sort_ms = next(r["ms"] for r in [*rows, row] if r["setting"] == name and r["variant"] == "sort")
                row["speedup_vs_sort"] = sort_ms / row["ms"]
                rows.append(row)
                print(
                    f"{name:<10} {label:<42} {row['ms']:>8.3f} {row['speedup_vs_sort']:>7.2f}x "
                    f"{row['first_call_s']:>12.1f} {row['kept_share']:>6.3f}"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--settings", nargs="+", default=["top_p=0.9", "top_k=50", "none"])
    parser.add_argument(
        "--triton-configs",
        nargs="+",
        default=["4096,512,16,16", "2048,256,16,8", "2048,512,16,16", "2048,1024,16,32", "4096,1024,16,32"],
        help="Triton kernel variants: BLOCK,SEARCH_BLOCK,FAN_OUT,WARPS each",
    )
    parser.add_argument("--fan-outs", type=int, nargs="+", default=[4, 8], help="compiled variants' fan-outs")
    parser.add_argument("--eager-fan-outs", type=int, nargs="+", default=[2, 4], help="eager variants' fan-outs")
    parser.add_argument("--iters", type=int, default=10, help="draws per captured graph (CPU: timed calls)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled variants")
    parser.add_argument("--out", default="benchmarks/results/sampling_kernels.json")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (or --device cpu for a smoke run)")
    where = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"sampled step: batch {args.batch} x vocab {args.vocab}, bf16 logits, temperature 1 ({where})")
    rows = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "device": where, "torch": torch.__version__, "rows": rows}, indent=1)
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
