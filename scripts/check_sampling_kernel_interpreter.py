"""The Triton sampling kernel checked on a CPU, under Triton's interpreter (no GPU needed).

``sampling_triton_kernel.sample_rows_kernel`` launched with CPU tensors and ``TRITON_INTERPRET=1``:

- **kept**: at a mixed batch (top-k, top-p, min-p, unfiltered, ``top_k = 1`` and greedy rows; bf16
  and fp32 logits) every drawn token lies in the torch search's kept set
  (``sampling_kernels.kept_mask``), argmax rows take the argmax, the logprob is
  ``log_softmax(logits / T)`` at the token, and the top-k-only and top-p-only forms keep the same;
- **dist**: draws of five 12-token cases (ties at a top-k and at a top-p threshold, min-p alone,
  no filter, mixed) follow the sorted filter's truncated distribution: no token the filter drops
  is drawn, every kept token expected 10 times or more is, and the total variation is printed
  (about 0.02 is the sampling noise at 3,000 draws).

Triton is not part of the CPU install: ``pip install --target /tmp/triton triton`` (about 1 GB),
then ``python scripts/check_sampling_kernel_interpreter.py --triton-path /tmp/triton``. The
interpreter runs a program at a time in numpy: ``dist`` at 3,000 draws takes about 8 minutes on
two cores. Exits 1 when a check fails. The GPU tests (``tests/gpu/test_sampling_triton_gpu.py``)
check the same on CUDA at the server's shape, with 200,000 draws.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

TOP_K_NONE = 1 << 30
CASES = {
    "mixed": ([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45], 6, 0.85, 0.02, 0.9),
    "top_k_ties": ([1.0, 1.0, 0.5, 1.0, 0.5, 0.5, -1.0, 1.0, 0.0, 0.5, -2.0, 0.0], 5, 0.8, 0.0, 1.0),
    "top_p_ties": ([1.0, 1.0, 0.5, 1.0, 0.5, 0.5, -1.0, 1.0, 0.0, 0.5, -2.0, 0.0], TOP_K_NONE, 0.5, 0.0, 1.0),
    "min_p_only": ([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45], TOP_K_NONE, 1.0, 0.3, 1.0),
    "plain": ([2.1, 0.3, -1.0, 1.7, 0.9, -0.4, 1.2, -2.5, 0.0, 0.6, -1.6, 1.45], TOP_K_NONE, 1.0, 0.0, 1.2),
}


def draw(logits, temps, top_ks, top_ps, min_ps, greedy, seeds, top_k_rows=True, top_p_rows=True):
    """One launch of the kernel over CPU tensors (the interpreter's), with the server's configuration."""
    import torch

    from areal_tasks.inference.server import sampling_triton

    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64)
    logprobs = torch.empty(rows, dtype=torch.float32)
    sampling_triton._kernel()[(rows,)](
        logits, logits.stride(0), vocab, temps.float(), top_ks.long(), top_ps.float(), min_ps.float(),
        greedy.to(torch.int8), seeds.long(), tokens, logprobs,
        FILTERED=top_k_rows or top_p_rows, KEY_BITS=32 if logits.dtype == torch.float32 else 16,
        TOP_K_ROWS=top_k_rows, TOP_P_ROWS=top_p_rows, FAN=sampling_triton.FAN_OUT,
        BLOCK_V=sampling_triton.BLOCK, SEARCH_BLOCK=sampling_triton.SEARCH_BLOCK, num_warps=sampling_triton.NUM_WARPS,
    )  # fmt: skip
    return tokens, logprobs


def check_kept(rows: int, vocab: int) -> list[str]:
    """Failures of the kept-set, argmax and logprob checks (empty: all passed)."""
    import torch

    from areal_tasks.inference.server.sampling_kernels import kept_mask, order_keys, search_rounds

    failures, gen = [], torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(rows, vocab, generator=gen) * 2
        logits[:, : vocab // 16] += 6 * torch.rand(rows, vocab // 16, generator=gen)
        logits = logits.to(dtype)
        temps = torch.rand(rows, generator=gen) + 0.5
        top_ks = torch.randint(1, vocab // 10, (rows,), generator=gen)
        top_ps = torch.rand(rows, generator=gen) * 0.9 + 0.1
        min_ps = torch.rand(rows, generator=gen) * 0.2
        top_ks[::3], top_ps[1::3], min_ps[2::3] = TOP_K_NONE, 1.0, 0.0
        top_ks[5], top_ps[5] = 1, 1.0
        greedy = torch.zeros(rows, dtype=torch.bool)
        greedy[7] = True
        temps[greedy] = 1.0
        probs = torch.softmax(logits.float() / temps.view(-1, 1), -1)
        rounds = search_rounds(32 if dtype == torch.float32 else 16)
        no_k, no_p = torch.full((rows,), TOP_K_NONE), torch.ones(rows)
        forms = {
            "general": (top_ks, top_ps, True, True),
            "top-k only": (top_ks, no_p, True, False),
            "top-p only": (no_k, top_ps, False, True),
        }
        for seed in range(2):
            seeds = torch.randint(0, 2**62, (rows,), generator=torch.Generator().manual_seed(seed))
            for form, (ks, ps, by_k, by_p) in forms.items():
                kept = kept_mask(order_keys(logits), probs, ks, ps, min_ps, rounds)
                tokens, logprobs = draw(logits, temps, ks, ps, min_ps, greedy, seeds, by_k, by_p)
                where = f"{dtype}, {form}, seed {seed}"
                if not kept.gather(1, tokens.view(-1, 1)).all():
                    failures.append(f"{where}: a drawn token outside the kept set")
                argmax_rows = greedy | (ks == 1)
                if not torch.equal(tokens[argmax_rows], logits.float()[argmax_rows].argmax(-1)):
                    failures.append(f"{where}: an argmax row drew another token")
                want = torch.log_softmax(logits.float() / temps.view(-1, 1), -1).gather(1, tokens.view(-1, 1)).view(-1)
                if not torch.allclose(logprobs, want, rtol=0, atol=2e-5):
                    failures.append(f"{where}: logprobs off by {(logprobs - want).abs().max().item():.2e}")
        print(f"kept  {dtype}: {'ok' if not failures else 'FAILED'}", flush=True)
    return failures


def check_distribution(draws: int) -> list[str]:
    """Failures of the distribution checks; prints each case's total variation."""
    import torch

    from areal_tasks.inference.server.sampling_kernels import sorted_filter

    failures = []
    for case, (values, top_k, top_p, min_p, temperature) in CASES.items():
        vocab = len(values)
        batch = torch.tensor(values).expand(draws, vocab).to(torch.bfloat16).contiguous()
        ones, top_ks = torch.ones(draws), torch.full((draws,), top_k)
        seeds = torch.randint(0, 2**62, (draws,), generator=torch.Generator().manual_seed(2026))
        started = time.monotonic()
        tokens, _ = draw(
            batch, ones * temperature, top_ks, ones * top_p, ones * min_p, torch.zeros(draws, dtype=torch.bool), seeds,
            top_k < TOP_K_NONE, top_p < 1.0,
        )  # fmt: skip
        weights, ids = sorted_filter(
            torch.softmax(batch[:1].float() / temperature, -1), top_ks[:1], ones[:1] * top_p, ones[:1] * min_p
        )
        expected = torch.zeros(vocab).scatter_(0, ids[0], weights[0])
        expected = (expected / expected.sum()).double()
        counts = torch.bincount(tokens, minlength=vocab).double()
        tv = 0.5 * (counts / draws - expected).abs().sum().item()
        outside = bool((counts[expected == 0] > 0).any())
        missed = bool((counts[expected * draws >= 10] == 0).any())  # a kept token expected 10+ times never drawn
        if outside or missed:
            failures.append(
                f"{case}: " + ("drew a token the filter drops" if outside else "never drew a likely kept token")
            )
        same_support = not (outside or missed)
        print(f"dist  {case:<11} support {'ok' if same_support else 'DIFFERS'}  total variation {tv:.4f}  "
              f"({time.monotonic() - started:.0f} s)", flush=True)  # fmt: skip
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triton-path", help="a folder holding Triton (pip install --target ...), added to sys.path")
    parser.add_argument("--checks", nargs="+", choices=("kept", "dist"), default=["kept", "dist"])
    parser.add_argument("--draws", type=int, default=3000, help="draws per distribution case")
    parser.add_argument("--rows", type=int, default=24, help="rows of the kept check's batch")
    parser.add_argument("--vocab", type=int, default=5000, help="vocabulary of the kept check's batch")
    args = parser.parse_args()
    os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.triton_path:
        sys.path.append(args.triton_path)
    try:
        import triton  # noqa: F401
    except ImportError:
        parser.error(
            "Triton is not importable: pip install --target /tmp/triton triton, then --triton-path /tmp/triton"
        )
    failures = check_kept(args.rows, args.vocab) if "kept" in args.checks else []
    if "dist" in args.checks:
        failures += check_distribution(args.draws)
    for failure in failures:
        print("FAILED", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
