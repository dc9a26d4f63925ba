"""GPU decode path: static-shape decode steps captured as one CUDA graph per batch-size bucket.

:class:`GraphModelRunner` is a :class:`ModelRunner` whose :meth:`decode` runs a static forward when
the running sequences sit in slots ``0..B-1`` (the engine keeps them there): the batch is padded
up to the next bucket (padding rows write position 0 of free slots, which nothing reads), token
ids and positions go through fixed device buffers, new keys/values are scattered into the slot
cache in place, and attention reads each row's slot over the whole context with a mask built on
the device from the positions. Attention reads each row's slot up to a length bucket (256, 512,
1024, ... and the context length) that covers the longest filled position of the batch, so short
sequences do not pay for the whole context. With ``capture`` (the default on CUDA) the forward of
every (batch bucket, length bucket) pair is captured once at start-up and replayed, so a step
costs one graph launch instead of hundreds of kernel launches; without it (CPU tests) the same
static forward runs eagerly. Anything else (other slot layouts, batches above the largest
bucket) falls back to the eager decode.

With ``compile_scope="blocks"`` (the default) the captured forwards run whole decoder blocks
through ``torch.compile`` with fused input projections (``block_compile.py``), swapped in for the
capture only; if that capture fails, the error is logged and the graphs are captured again with
the per-module compile (``pointwise``).

Weight updates copy into the parameters in place and a cache flush zeroes the storage in place,
so the captured graphs stay valid for the life of the server. If capture fails (a model whose
forward is not capturable), the error is logged with its traceback and the static steps run
eagerly; ``/server_info`` reports ``cuda_graphs: false`` then.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
from typing import Any

import torch
from transformers.cache_utils import Cache

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.attention import static_shapes
from areal_tasks.inference.server.block_compile import CompiledBlocks
from areal_tasks.inference.server.greedy import GreedyPicker
from areal_tasks.inference.server.kv_cache import SlotKVCache
from areal_tasks.inference.server.model_runner import ModelRunner, RunnerConfig, take_carried
from areal_tasks.models.compile import decoder_blocks

logger = logging.getLogger(__name__)

COMPILE_SCOPES = ("pointwise", "blocks")
_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)


def length_buckets(max_len: int, smallest: int = 256) -> list[int]:
    """KV lengths attention may read: ``smallest`` doubling while below ``max_len``, then ``max_len``."""
    buckets = []
    length = smallest
    while length < max_len:
        buckets.append(length)
        length *= 2
    return [*buckets, max_len]


def batch_buckets(max_batch: int) -> list[int]:
    """Captured batch sizes: powers of two, then steps of 16/32/64, up to and including ``max_batch``."""
    buckets = [b for b in _BUCKETS if b < max_batch]
    step = 64
    while buckets and buckets[-1] + step < max_batch:
        buckets.append(buckets[-1] + step)
    return [*buckets, max_batch]


@torch.compiler.disable
def write_at_positions(kv: torch.Tensor, positions: torch.Tensor, new: torch.Tensor) -> None:
    """Write ``new`` [2, b, kv_heads, 1, head_dim] (one key and one value per row ``i < b``) into
    ``kv[:, i, :, positions[i]]`` of a layer's store [2, slots, kv_heads, max_len, head_dim], in
    place, with one kernel.

    Never traced by ``torch.compile``: a compiled graph turns an in-place write into a graph input
    into a functional copy of the whole store followed by a copy back (a layer's entire cache, every
    block and step), which made compiled decoder blocks slower than eager ones. Called eagerly
    between the compiled parts of a block, it is one small scatter; the stack of keys and values
    before it fuses into the compiled kernel that produced them.
    """
    _, b, kv_heads, _, head_dim = new.shape
    index = positions.view(1, b, 1, 1, 1).expand(2, b, kv_heads, 1, head_dim)
    kv[:, :b].scatter_(3, index, new)


class StaticCacheView(Cache):
    """The cache of a static decode step over slots ``0..b-1`` (positions read from a device buffer)."""

    def __init__(self, store: SlotKVCache, positions: torch.Tensor, kv_len: int) -> None:
        super().__init__(layers=[])
        self.store = store
        self.positions = positions  # [b] view of the runner's position buffer
        self.kv_len = kv_len
        self._selected: torch.Tensor | None = None

    def use_layer(self, layer: int) -> None:
        """Make the next ``update`` use ``layer``'s storage whatever index it is given (compiled
        blocks: ``block_compile.py``); the storage must exist already (it does after warm-up)."""
        self._selected = self.store.kv[layer]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        kv = self._selected if self._selected is not None else self.store.layer_kv(layer_idx, key_states)
        b = key_states.shape[0]
        write_at_positions(kv, self.positions, torch.stack((key_states, value_states)))
        return kv[0, :b, :, : self.kv_len], kv[1, :b, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0


class GraphModelRunner(ModelRunner):
    """A model runner with bucketed static decode steps, CUDA-graph captured on GPU (see the module doc)."""

    def __init__(self, cfg: RunnerConfig, capture: bool | None = None) -> None:
        if cfg.compile_scope not in COMPILE_SCOPES:
            raise InferenceError(f"compile_scope must be one of {', '.join(COMPILE_SCOPES)}, got {cfg.compile_scope!r}")
        super().__init__(cfg)
        self.capture = self.device.type == "cuda" if capture is None else capture
        #: the compiled whole blocks the captured steps run (``compile_scope="blocks"``).
        self._block_forwards = (
            CompiledBlocks(decoder_blocks(self.model))
            if self.capture and self.compiled and cfg.compile_scope == "blocks"
            else None
        )
        self.buckets = batch_buckets(min(cfg.max_running_requests, self.cache.num_slots))
        self.lengths = length_buckets(self.max_len)
        largest = self.buckets[-1]
        #: row 0: token ids, row 1: positions, row 2: rows of the carried tokens (one host-to-device
        #: copy per step; the graphs read rows 0 and 1).
        self._inputs = torch.zeros(3, largest, dtype=torch.long, device=self.device)
        #: two pinned host buffers used in turn: the overlapped engine writes step N+1's inputs
        #: before the copy of step N's has necessarily run (it has waited for step N-1's results,
        #: which the device produced after reading step N-1's inputs, so a buffer is free again
        #: two steps later).
        pinned = self.device.type == "cuda"
        self._stagings = [torch.zeros(3, largest, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._step = 0
        #: (rows, batch bucket, largest position) of the last captured-shape step, while the device
        #: buffers still hold its inputs (:meth:`decode_again`); None after an eager step.
        self._static_step: tuple[int, int, int] | None = None
        self._graphs: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}
        if self.capture:
            self._capture_or_fall_back()
        if self.capture and self.compiled:
            self.greedy = GreedyPicker(compiled=True, kernel=True)
            self.greedy.warm_up(self.config.vocab_size, self.dtype, self.device)
            # the sort-free sampler of sampled batches: the Triton kernel, or compiled where Triton is missing
            self.greedy.warm_up_draw(self.config.vocab_size, self.dtype, self.device)

    @property
    def compile_scope(self) -> str | None:
        """What the captured decode steps compile: ``blocks``, ``pointwise`` or None (nothing)."""
        if not self.capture or not self.compiled:
            return None
        return "blocks" if self._block_forwards is not None else "pointwise"

    def _capture_or_fall_back(self) -> None:
        try:
            self._capture_all()
            return
        except RuntimeError:
            self._graphs.clear()
            if self._block_forwards is None:
                # a model whose forward cannot be captured still serves, with eager static steps
                logger.exception("CUDA graph capture failed; decode steps run eagerly")
                self.capture = False
                return
            logger.exception(
                "CUDA graph capture with compiled decoder blocks failed; capturing the "
                "per-module compiled forward instead"
            )
            self._block_forwards = None
        self._capture_or_fall_back()

    def _compiled_blocks(self, view: StaticCacheView) -> contextlib.AbstractContextManager:
        """The compiled whole blocks over ``view`` (``compile_scope="blocks"``), else nothing."""
        return self._block_forwards.active(view) if self._block_forwards is not None else contextlib.nullcontext()

    def _static_forward(self, batch: int, kv_len: int) -> torch.Tensor:
        ids = self._inputs[0, :batch].view(batch, 1)
        positions = self._inputs[1, :batch].view(batch, 1)
        view = StaticCacheView(self.cache, self._inputs[1, :batch], kv_len)
        masks = self._masks(positions, kv_len, trivial=False, additive=True)  # built once a step
        with (
            static_shapes(),
            self._compiled_blocks(view),
        ):  # fixed shapes: SDPA may use cuDNN (planned in the warm-up runs)
            return self._forward(ids, positions, view, masks, 1, upcast=False)[:, -1]

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        for kv_len in reversed(self.lengths):
            for batch in reversed(self.buckets):
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self._static_forward(batch, kv_len)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    logits = self._static_forward(batch, kv_len)
                self._graphs[(batch, kv_len)] = (graph, logits)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.synchronize(self.device)
        logger.info("captured CUDA graphs: decode batch sizes %s x KV lengths %s", self.buckets, self.lengths)

    @torch.inference_mode()
    def decode(
        self,
        slots: list[int],
        tokens: list[int],
        positions: list[int],
        carried: torch.Tensor | None = None,
        carried_rows: list[int] | None = None,
    ) -> torch.Tensor:
        """:meth:`ModelRunner.decode` through the captured steps where the batch allows; the logits
        [B, V] stay in the model's dtype (the sampler upcasts as it reads them: no fp32 copy)."""
        count = len(slots)
        top = max(positions)
        if count > self.buckets[-1] or top >= self.max_len or slots != list(range(count)):
            self._static_step = None
            return super().decode(slots, tokens, positions, carried, carried_rows)
        batch = self.buckets[bisect.bisect_left(self.buckets, count)]
        staging = self._stagings[self._step % 2]
        self._step += 1
        staging.zero_()
        staging[0, :count] = torch.tensor(tokens)
        staging[1, :count] = torch.tensor(positions)
        if carried is not None and carried_rows is not None:
            staging[2, :count] = torch.tensor(carried_rows)
        # the whole buffer: a [:, :batch] slice of either side is strided, and a strided copy goes
        # through pageable and device temporaries (the rows past the batch are zeros, unread)
        self._inputs.copy_(staging, non_blocking=True)
        if carried is not None and carried_rows is not None:
            ids = self._inputs[0, :count]
            ids.copy_(take_carried(ids, carried, self._inputs[2, :count]))
        lengths = self.cache.lengths
        for slot, position in zip(slots, positions):
            lengths[slot] = position + 1
        self._last_decode = (slots, None)
        return self._run_static(count, batch, top)

    @torch.inference_mode()
    def decode_again(self, carried: torch.Tensor) -> torch.Tensor:
        """:meth:`ModelRunner.decode_again` without the host: after a captured-shape step, the
        positions in the device buffer advance by one in place and the token ids are ``carried``'s
        first rows (padding rows keep position 0); nothing is staged or copied from the host."""
        if self._static_step is None or self._static_step[2] + 1 >= self.max_len:
            return super().decode_again(carried)
        count, batch, top = self._static_step
        self._inputs[1, :count] += 1
        self._inputs[0, :count].copy_(carried[:count])
        lengths = self.cache.lengths
        lengths[:count] = [n + 1 for n in lengths[:count]]
        return self._run_static(count, batch, top + 1)

    def _run_static(self, count: int, batch: int, top: int) -> torch.Tensor:
        """Run the static step of ``batch`` rows (the first ``count`` real) over the device buffers,
        reading the KV cache up to the length bucket that covers position ``top``."""
        kv_len = self.lengths[bisect.bisect_left(self.lengths, top + 1)]
        if self.capture:
            graph, logits = self._graphs[(batch, kv_len)]
            graph.replay()
        else:
            logits = self._static_forward(batch, kv_len)
        self._static_step = (count, batch, top)
        return logits[:count]


def build_runner(cfg: RunnerConfig) -> ModelRunner:
    """The runner for ``cfg``: CUDA-graph decode on a GPU (unless disabled), the eager runner otherwise
    (always for a vision-language model: its decode rows carry per-sequence rotary offsets)."""
    from areal_tasks.inference.server.model_runner import resolve_device
    from areal_tasks.inference.server.server import vision_model

    if resolve_device(cfg.device).type == "cuda" and cfg.cuda_graphs and not vision_model(cfg.model_path):
        return GraphModelRunner(cfg)
    return ModelRunner(cfg)
