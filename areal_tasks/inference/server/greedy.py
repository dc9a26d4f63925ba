"""A greedy step's tokens and logprobs in one pass over the logits, and the picker a runner hands
the sampler.

Greedy decoding needs each row's argmax and its log-probability: the row's maximum minus its
log-sum-exp. Eagerly that is an fp32 copy of the ``[B, V]`` logits and two reductions over it,
which at batch 256 and a 151,936-token vocabulary is a sizeable share of a decode step's device
time (docs/benchmarks_history.md, "Inference throughput (H200)", second session). Compiled, the
same function reads the half-precision logits once, upcasting in registers.

:class:`GreedyPicker` is what a model runner hands the sampler: eager by default, compiled where
the runner compiles (CUDA with ``torch_compile``), and warmed up for the batch shapes that would
otherwise compile on the first request (``dynamic=True`` serves every batch size but 1). It also
carries the sampled (non-greedy) batches' kernel, :func:`~.sampling_kernels.draw_rows` (the
sort-free top-k/top-p/min-p draw), compiled alongside (3.9 ms against the sort's 4.6 at batch 256
on an H200). Uncompiled on a GPU, a filtering batch takes the sort instead: there the search's
eager passes over ``[B, V]`` temporaries cost 12.7 ms (docs/benchmarks.md, "Sampling without a
sort").
"""

from __future__ import annotations

import logging

import torch

from areal_tasks.inference.server import sampling_triton
from areal_tasks.inference.server.sampling_kernels import draw_rows, sorted_draw

logger = logging.getLogger(__name__)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax ids [B] int64, their logprobs [B] float32) of ``logits`` [B, V] of any float dtype."""
    scores = logits.float()
    best, tokens = scores.max(dim=-1)
    return tokens, best - torch.logsumexp(scores, dim=-1)


_HALF = (torch.bfloat16, torch.float16)
#: points a round of the sort-free draw's threshold search: fewer passes eagerly, fewer rounds compiled.
EAGER_FAN_OUT, COMPILED_FAN_OUT = 2, 4


class GreedyPicker:
    """:func:`greedy_pick` and :func:`draw_rows`, through ``torch.compile`` for half-precision
    logits when ``compiled``; sampled batches through the Triton kernel instead when ``kernel`` and
    Triton runs here (``sampling_triton.py``)."""

    def __init__(self, compiled: bool = False, kernel: bool = False) -> None:
        self.kernel = kernel and sampling_triton.kernel_available()
        self._fused = torch.compile(greedy_pick, dynamic=True) if compiled else None
        self._compiled = compiled
        self._draw = torch.compile(draw_rows, dynamic=True) if compiled and not self.kernel else None

    def __call__(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fused is not None and logits.dtype in _HALF:
            return self._fused(logits)
        return greedy_pick(logits)

    def draws_with_seeds(self, logits: torch.Tensor) -> bool:
        """Whether a sampled batch of ``logits`` goes to :meth:`kernel_draw` (a seed per row) rather
        than :meth:`draw` (a uniform number per row)."""
        return self.kernel and sampling_triton.kernel_fits(logits)

    def kernel_draw(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        top_ks: torch.Tensor,
        top_ps: torch.Tensor,
        min_ps: torch.Tensor,
        greedy: torch.Tensor,
        seeds: torch.Tensor,
        filtered: bool = True,
        top_k_rows: bool = True,
        top_p_rows: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row of a sampled batch through the Triton kernel (``sampling_triton.py``)."""
        return sampling_triton.triton_draw(
            logits, temperatures, top_ks, top_ps, min_ps, greedy, seeds, filtered, top_k_rows, top_p_rows
        )

    def draw(
        self,
        logits: torch.Tensor,
        temperatures: torch.Tensor,
        top_ks: torch.Tensor,
        top_ps: torch.Tensor,
        min_ps: torch.Tensor,
        greedy: torch.Tensor,
        uniforms: torch.Tensor,
        filtered: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row of a sampled batch: :func:`draw_rows` compiled for half-precision logits
        when ``compiled``; uncompiled, the same eagerly on a CPU but :func:`sorted_draw` on a GPU
        for a batch that filters (one sort is faster there than the search's eager passes; the
        same distribution). No filter: no sort and no search either way."""
        if self._draw is not None and logits.dtype in _HALF:
            fn, fan_out = self._draw, COMPILED_FAN_OUT
        elif filtered and logits.is_cuda:
            return sorted_draw(logits, temperatures, top_ks, top_ps, min_ps, greedy, uniforms)
        else:
            fn, fan_out = draw_rows, EAGER_FAN_OUT
        return fn(logits, temperatures, top_ks, top_ps, min_ps, greedy, uniforms, filtered=filtered, fan_out=fan_out)

    @torch.inference_mode()
    def warm_up(self, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        """Compile :func:`greedy_pick` now for one row and for several (the shapes a server meets first).

        Under inference mode, as the engine thread calls it: compiled code is guarded on the grad
        mode and on its inputs being inference tensors, so a warm-up outside it left the engine's
        first greedy step to compile again (and compiling waits for the device)."""
        if self._fused is None:
            return
        for rows in (1, 2):
            self(torch.zeros(rows, vocab, dtype=dtype, device=device))

    @torch.inference_mode()
    def warm_up_draw(self, vocab: int, dtype: torch.dtype, device: torch.device) -> None:
        """Compile :func:`draw_rows` now for one row and for several, with and without filters
        (four compilations: about a minute on a CPU, so only the GPU runner calls this). If the
        compilation fails, the error is logged with its traceback and sampled batches draw eagerly
        (the same results, more passes over the logits). A picker that draws with the Triton kernel
        compiles it here instead (once for each of the kernel's four forms, a few seconds); if that fails,
        the error is logged with its traceback and sampled batches take the torch draw. Under
        inference mode, as the engine thread calls it (see :meth:`warm_up`)."""
        if self.kernel:
            logits = torch.zeros(2, vocab, dtype=dtype, device=device)
            ones = torch.ones(2, device=device)
            no = torch.zeros(2, dtype=torch.bool, device=device)
            seeds = torch.zeros(2, dtype=torch.long, device=device)
            try:  # each form a batch can take: no search; counts, masses or both
                for filtered, top_k, top_p in ((False, False, False), (True, True, False), (True, False, True)):
                    top_ks = torch.full((2,), 2 if top_k else vocab, dtype=torch.long, device=device)
                    self.kernel_draw(
                        logits,
                        ones,
                        top_ks,
                        ones * (0.5 if top_p else 1.0),
                        ones * 0,
                        no,
                        seeds,
                        filtered=filtered,
                        top_k_rows=top_k,
                        top_p_rows=top_p,
                    )
                self.kernel_draw(logits, ones, top_ks, ones * 0.5, ones * 0, no, seeds)
                return
            except Exception:  # a Triton build or launch error: any type; logged, then the torch draw
                logger.exception("the Triton sampling kernel failed to build; sampled batches use the torch draw")
                self.kernel = False
                self._draw = torch.compile(draw_rows, dynamic=True) if self._compiled else None
        if self._draw is None:
            return
        try:
            for rows in (1, 2):
                # a tensor of its own per argument, as a SamplingBatch has: compiled code is guarded on
                # which inputs alias one another, so shared ones would compile a variant never used
                def column(value: float, rows: int = rows) -> torch.Tensor:
                    return torch.full((rows,), value, device=device)

                logits = torch.zeros(rows, vocab, dtype=dtype, device=device)
                top_ks = torch.full((rows,), vocab, dtype=torch.long, device=device)
                no = torch.zeros(rows, dtype=torch.bool, device=device)
                for filtered in (False, True):
                    self.draw(logits, column(1.0), top_ks, column(0.5), column(0.0), no, column(0.5), filtered=filtered)
        except RuntimeError:  # torch._dynamo's and Inductor's errors are RuntimeErrors
            logger.exception("compiling the sort-free sampler failed; sampled batches draw eagerly")
            self._draw = None
