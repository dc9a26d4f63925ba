"""The model runner: a Hugging Face causal LM, its tokenizer and the slot KV cache, one forward at a time.

Any ``AutoModelForCausalLM`` whose attention layers go through ``Cache.update`` works: the runner
hands the model a :class:`~areal_tasks.inference.server.kv_cache.BatchCacheView` and a prepared
attention mask per layer type (full and sliding-window attention), plus explicit position ids.

Attention is transformers' SDPA with grouped-query decode (``attention.py``). Two kinds of forward:

* :meth:`ModelRunner.prefill` runs one sequence's new tokens (a prompt, or a prompt plus the
  output kept over a ``retract`` pause) into its slot. Starting at position 0 it passes no mask, so
  SDPA runs causally exactly as ``transformers.generate`` does for a single prompt.
* :meth:`ModelRunner.decode` runs one new token for each of many slots (continuous batching); each
  row attends to its own slot's filled positions only.

A vision-language model (a config with a ``vision_config``: Qwen2-VL, Qwen2.5-VL) loads as
``AutoModelForImageTextToText`` with its image processor (``vision.py`` prepares a prompt's images).
Its prefill of a prompt with images runs the vision tower, writes its features into the prompt's
embeddings at the images' placeholders and takes the prompt's multimodal rotary positions; its
decode rows rotate at ``position + rope_delta`` of their own sequence. Text-only prompts run
through it as through a causal LM. It is served without ``torch.compile`` (and the
server decodes it without CUDA graphs: ``server.py``).

Only the calling thread (the engine loop) may use a runner: it is not thread-safe.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from areal_tasks.errors import InferenceError, ModelError
from areal_tasks.inference.server.attention import register_serve_attention, use_decode_kernel
from areal_tasks.inference.server.decode_kernel import kernel_available
from areal_tasks.inference.server.greedy import GreedyPicker
from areal_tasks.inference.server.images import DEFAULT_IMAGE_CACHE_MB
from areal_tasks.inference.server.kv_cache import BatchCacheView, SlotKVCache
from areal_tasks.inference.server.transfer import host_to_device
from areal_tasks.inference.server.vision import VisionPreparer, VisionPrompt
from areal_tasks.models.compile import compile_pointwise_modules

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")
DECODE_ATTENTION_CHOICES = ("auto", "triton", "sdpa")


@dataclass(frozen=True)
class RunnerConfig:
    """What to load and how much cache to reserve."""

    model_path: str
    #: ``auto`` (float32 on CPU, the checkpoint's dtype on CUDA), ``float32``, ``bfloat16``, ``float16``.
    dtype: str = "auto"
    #: ``auto`` (cuda when available), ``cpu``, ``cuda``, ``cuda:N``.
    device: str = "auto"
    #: sequences decoded together at most (KV slots).
    max_running_requests: int = 32
    #: prompt + output tokens of one sequence at most; None = the model's max_position_embeddings.
    context_length: int | None = None
    #: tokenizer directory; None = the model directory.
    tokenizer_path: str | None = None
    #: on CUDA, capture decode steps as CUDA graphs per batch-size bucket (``cuda_graph.py``).
    cuda_graphs: bool = True
    #: on CUDA, ``torch.compile`` the norms and MLPs (fused element-wise work; captured into the graphs).
    torch_compile: bool = True
    #: what the CUDA-graph decode steps compile (with ``torch_compile``): ``blocks`` (whole decoder
    #: blocks, attention included, with fused input projections; ``block_compile.py``) or
    #: ``pointwise`` (the norms and MLPs only, as every other forward; ``models/compile.py``).
    compile_scope: str = "blocks"
    #: the grouped decode attention: ``auto`` (the Triton kernel of ``decode_kernel.py`` on CUDA
    #: where Triton imports, SDPA otherwise), ``triton`` (the kernel, or an error where it cannot
    #: run) or ``sdpa``.
    decode_attention: str = "auto"
    #: host memory (MiB) for the processed images of a vision-language model, by content
    #: (``image_cache.py``); 0 = process every image sent.
    image_cache_mb: int = DEFAULT_IMAGE_CACHE_MB


def resolve_device(name: str) -> torch.device:
    """``auto`` means the current CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InferenceError(f"device {name!r} asked for, but CUDA is not available")
    return device


def take_carried(ids: torch.Tensor, carried: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``carried[rows[i]]`` where ``rows[i] >= 0``, else ``ids[i]``; on the device, without a sync."""
    return torch.where(rows >= 0, carried.index_select(0, rows.clamp(min=0)), ids)


def right_padded(rows: list[list[int]], width: int) -> torch.Tensor:
    """``rows`` of token ids as one ``[len(rows), width]`` int64 CPU tensor, right-padded with 0.

    One tensor built from Python lists, not a tensor and a copy a row: each torch call releases the
    interpreter lock, and during a burst of requests the HTTP thread takes it each time, so a
    prefill of 64 prompts waited for the lock up to 128 times."""
    return torch.tensor([[*row, *([0] * (width - len(row)))] for row in rows], dtype=torch.long)


def on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` current in this thread (new threads start on cuda:0); a no-op on CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def is_vision_config(config: Any) -> bool:
    """Whether a Hugging Face config is a vision-language model's (it has a ``vision_config``)."""
    return getattr(config, "vision_config", None) is not None


def resolve_dtype(name: str, device: torch.device, config: Any) -> torch.dtype:
    """``auto``: float32 on CPU; on CUDA the checkpoint's dtype (bfloat16 if it says float32 or nothing)."""
    if name != "auto":
        if name not in _DTYPES:
            raise InferenceError(f"dtype must be auto or one of {sorted(_DTYPES)}, got {name!r}")
        return _DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    stored = getattr(torch, stored) if isinstance(stored, str) else stored
    return stored if stored in (torch.bfloat16, torch.float16) else torch.bfloat16


class ModelRunner:
    """Owns the model, the tokenizer and the KV cache of one server (see the module doc)."""

    def __init__(self, cfg: RunnerConfig) -> None:
        from transformers import AutoConfig, AutoTokenizer

        path = Path(cfg.model_path).expanduser()
        if not (path / "config.json").is_file():
            raise ModelError(f"{cfg.model_path}: not a Hugging Face model directory (no config.json)")
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        hf_config = AutoConfig.from_pretrained(path)
        self.dtype = resolve_dtype(cfg.dtype, self.device, hf_config)
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_path or path)
        self._targets: dict[str, torch.Tensor] = {}
        self._targets_model: torch.nn.Module | None = None
        #: the model reads images (a vision-language model); ``vision`` prepares them.
        self.is_vision = is_vision_config(hf_config)
        self.model = self._load_model(path)
        self.model.to(self.device).eval()
        self.vision: VisionPreparer | None = None
        if self.is_vision:
            from transformers import AutoImageProcessor

            self.vision = VisionPreparer(self.model, AutoImageProcessor.from_pretrained(path), cfg.image_cache_mb << 20)
        #: ``triton`` or ``sdpa``: what runs the grouped decode attention (``RunnerConfig.decode_attention``).
        self.decode_attention = self._decode_attention(cfg.decode_attention)
        compile_now = cfg.torch_compile and self.device.type == "cuda"
        if compile_now and self.is_vision:
            logger.info("%s is a vision-language model: served without torch.compile", cfg.model_path)
        #: names of the modules run through torch.compile (CUDA only; empty otherwise).
        self.compiled = compile_pointwise_modules(self.model) if compile_now and not self.is_vision else []
        #: what the sampler calls for an all-greedy batch (compiled by the CUDA-graph runner); on CUDA,
        #: sampled batches draw with the Triton kernel (sampling_triton.py).
        self.greedy = GreedyPicker(kernel=self.device.type == "cuda")
        self.config = self.model.config
        #: the language model's config (the config itself for a causal LM).
        self.text_config = self.config.get_text_config()
        self._window = getattr(self.text_config, "sliding_window", None)
        self._use_mapping = bool(getattr(self.text_config, "layer_types", None))
        if self._use_mapping:
            self._layer_types = set(self.text_config.layer_types)
        else:
            # no per-layer types (e.g. Mistral): a sliding_window applies to every layer
            self._layer_types = {"sliding_attention" if self._window else "full_attention"}
        unsupported = self._layer_types - set(_SUPPORTED_LAYER_TYPES)
        if unsupported:
            raise ModelError(f"{cfg.model_path}: layer types {sorted(unsupported)} are not supported")
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        max_pos = int(getattr(self.text_config, "max_position_embeddings", 0) or 0) or 4096
        self.max_len = min(cfg.context_length or max_pos, max_pos)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.eos_token_ids = self._eos_ids()
        self.cache = SlotKVCache(cfg.max_running_requests, self.max_len, self.device)
        #: the slots and rotary offsets of the last :meth:`decode` call (:meth:`decode_again`).
        self._last_decode: tuple[list[int], list[int] | None] = ([], None)
        self._warm_up()
        logger.info(
            "loaded %s (%s) on %s as %s: %d slots, context %d",
            path,
            type(self.model).__name__,
            self.device,
            self.dtype,
            cfg.max_running_requests,
            self.max_len,
        )

    def _load_model(self, path: Path) -> torch.nn.Module:
        """The causal LM, or the vision-language model with the serving attention in its language model
        and SDPA in its vision tower (whose attention is not over the KV cache)."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        serve = register_serve_attention()
        if self.is_vision:
            return AutoModelForImageTextToText.from_pretrained(
                path, dtype=self.dtype, attn_implementation={"text_config": serve, "vision_config": "sdpa"}
            )
        return AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype, attn_implementation=serve)

    def _decode_attention(self, choice: str) -> str:
        if choice not in DECODE_ATTENTION_CHOICES:
            raise InferenceError(
                f"decode_attention must be one of {', '.join(DECODE_ATTENTION_CHOICES)}, got {choice!r}"
            )
        usable = self.device.type == "cuda" and kernel_available()
        if choice == "triton" and not usable:
            raise InferenceError(
                "decode_attention='triton' needs a CUDA device and the triton package; "
                "use 'auto' (the kernel where it can run) or 'sdpa'"
            )
        if choice == "sdpa" or not usable:
            return "sdpa"
        layers = use_decode_kernel(self.model)
        logger.info("decode attention: the Triton kernel in %d attention layers", layers)
        return "triton"

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.model, "generation_config", None), self.config, self.text_config):
            eos = getattr(source, "eos_token_id", None)
            if eos is not None:
                ids.update([eos] if isinstance(eos, int) else eos)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return frozenset(ids)

    def _warm_up(self) -> None:
        """One tiny forward: allocates the KV storage and proves the model runs with this cache.

        With compiled modules, also one batched prefill per shape family torch.compile tells apart
        (it specialises sizes 0 and 1, so a batch of one, a prompt of one token and equal or
        ragged lengths each compile their own graph): compiled now, not in the first requests
        that meet them, where each compile stalled the engine and any pause for a weight update."""
        slots = [self.cache.allocate(), self.cache.allocate() if self.cache.free_slots else None]
        try:
            self.prefill(slots[0], [0], start=0)
            if self.compiled and slots[1] is not None:
                for prompts in ([[0, 0]], [[0, 0], [0, 0]], [[0, 0], [0, 0, 0]], [[0], [0]]):
                    self.prefill_batch(slots[: len(prompts)], prompts)
        finally:
            for slot in slots:
                if slot is not None:
                    self.cache.release(slot)

    # ---- masks ----
    def _mask(self, q_pos: torch.Tensor, kv_len: int, window: int | None, filled: torch.Tensor | None) -> torch.Tensor:
        """Bool mask [B, 1, T, kv_len]: a query at position p sees keys 0..p (and > p - window, and
        < the row's ``filled`` length)."""
        keys = torch.arange(kv_len, device=self.device).view(1, 1, 1, -1)
        queries = q_pos.view(q_pos.shape[0], 1, -1, 1)
        allowed = keys <= queries
        if window is not None:
            allowed &= keys > queries - window
        if filled is not None:
            allowed &= keys < filled.view(-1, 1, 1, 1)
        return allowed

    def _masks(
        self,
        q_pos: torch.Tensor,
        kv_len: int,
        trivial: bool,
        filled: torch.Tensor | None = None,
        additive: bool = False,
    ) -> Any:
        """The attention mask argument: one mask per layer type (None where plain causal suffices);
        boolean, or with ``additive`` SDPA's additive form in the model's dtype (0 where allowed,
        -inf elsewhere), which SDPA would otherwise derive from a boolean mask in every layer."""
        masks = {}
        for layer_type in self._layer_types:
            window = self._window if layer_type == "sliding_attention" else None
            plain = trivial and filled is None and not (window is not None and kv_len > window)
            mask = None if plain else self._mask(q_pos, kv_len, window, filled)
            if mask is not None and additive:
                mask = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
            masks[layer_type] = mask
        return masks if self._use_mapping else next(iter(masks.values()))

    def _forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        view: BatchCacheView,
        masks: Any,
        logits_to_keep: int | torch.Tensor,
        upcast: bool = True,
        **inputs: Any,
    ) -> torch.Tensor:
        """The model's logits for ``logits_to_keep``; in fp32 unless ``upcast`` is False (then in
        the model's dtype: the captured decode steps leave the upcast to the sampler). ``inputs``
        are the model's other inputs (a vision prefill's ``inputs_embeds``, in place of ``input_ids``)."""
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=masks,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{self._cache_kwarg: view},
            **inputs,
        )
        return out.logits.float() if upcast else out.logits

    def _embed_images(self, ids: torch.Tensor, vision: VisionPrompt) -> torch.Tensor:
        """The embeddings [1, T, H] of ``ids`` with the vision tower's features of the prompt's images
        at their placeholders (``VisionPrompt.image_tokens``; any other pad stays a text token)."""
        embeds = self.model.get_input_embeddings()(ids)
        features = self.model.get_image_features(
            vision.pixel_values.to(self.device), vision.image_grid_thw.to(self.device), return_dict=True
        ).pooler_output
        features = torch.cat(features) if isinstance(features, (tuple, list)) else features
        embeds[0, vision.image_tokens.to(self.device)] = features.to(embeds.dtype)
        return embeds

    # ---- forwards ----
    @torch.inference_mode()
    def prefill(
        self,
        slot: int,
        token_ids: list[int],
        start: int = 0,
        all_logits: bool = False,
        vision: VisionPrompt | None = None,
    ) -> torch.Tensor:
        """Run ``token_ids`` into ``slot`` at positions ``start..``; returns logits [T, V] (or [1, V]).
        With ``vision`` (a prompt's images, from position 0) the vision tower runs too and the
        tokens take the prompt's multimodal rotary positions."""
        steps = len(token_ids)
        if steps == 0 or start + steps > self.max_len:
            raise InferenceError(f"prefill of {steps} tokens at {start} does not fit the context of {self.max_len}")
        kv_len = start + steps
        positions = torch.arange(start, kv_len, device=self.device).view(1, -1)
        view = BatchCacheView(self.cache, [slot], [start], kv_len)
        masks = self._masks(positions, kv_len, trivial=(start == 0))
        ids: torch.Tensor | None = torch.tensor([token_ids], device=self.device)
        inputs: dict[str, Any] = {}
        rotary = positions
        if vision is not None:
            if start != 0:
                raise InferenceError(f"a prefill with images starts at position 0, not {start}")
            rotary = vision.positions_for(steps).to(self.device).view(3, 1, steps)
            inputs = {"inputs_embeds": self._embed_images(ids, vision)}
            ids = None
        logits = self._forward(ids, rotary, view, masks, 0 if all_logits else 1, **inputs)
        self.cache.lengths[slot] = kv_len
        return logits[0]

    @torch.inference_mode()
    def prefill_batch(self, slots: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Prefill several prompts from position 0 in one forward (right-padded); returns each
        prompt's last-token logits [B, V]. Logits are computed only at the distinct last positions,
        so callers keep the number of distinct prompt lengths per call small."""
        lengths = [len(p) for p in prompts]
        steps = max(lengths)
        if min(lengths) == 0 or steps > self.max_len:
            raise InferenceError(f"prefill lengths {min(lengths)}..{steps} do not fit the context of {self.max_len}")
        ids = right_padded(prompts, steps)
        positions = torch.arange(steps, device=self.device).expand(len(prompts), steps)
        view = BatchCacheView(self.cache, slots, [0] * len(prompts), steps)
        ragged = len(set(lengths)) > 1
        filled = torch.tensor(lengths, device=self.device) if ragged else None
        masks = self._masks(positions, steps, trivial=True, filled=filled)
        last = sorted(set(lengths))
        keep = torch.tensor([n - 1 for n in last], device=self.device)
        logits = self._forward(ids.to(self.device), positions, view, masks, keep)
        column = torch.tensor([last.index(n) for n in lengths], device=self.device)
        for slot, n in zip(slots, lengths):
            self.cache.lengths[slot] = n
        return logits[torch.arange(len(prompts), device=self.device), column]

    @torch.inference_mode()
    def prefill_from(self, slots: list[int], suffixes: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Prefill each ``suffixes[b]`` into ``slots[b]`` at positions ``starts[b]..`` (the slots hold
        the positions before it: cached prefixes) in one forward, right-padded; returns each row's
        last-token logits [B, V] (computed only at the distinct last positions)."""
        lengths = [len(s) for s in suffixes]
        steps = max(lengths)
        ends = [start + n for start, n in zip(starts, lengths)]
        if min(lengths) == 0 or max(starts) + steps > self.max_len:
            raise InferenceError(f"prefill of up to {steps} tokens from {max(starts)} does not fit {self.max_len}")
        ids = right_padded(suffixes, steps)
        first = host_to_device(starts, torch.long, self.device).view(-1, 1)
        positions = first + torch.arange(steps, device=self.device)
        kv_len = max(ends)
        view = BatchCacheView(self.cache, slots, starts, kv_len)
        masks = self._masks(positions, kv_len, trivial=False, filled=host_to_device(ends, torch.long, self.device))
        last = sorted(set(lengths))
        keep = torch.tensor([n - 1 for n in last], device=self.device)
        logits = self._forward(ids.to(self.device), positions, view, masks, keep)
        column = torch.tensor([last.index(n) for n in lengths], device=self.device)
        for slot, end in zip(slots, ends):
            self.cache.lengths[slot] = end
        return logits[torch.arange(len(suffixes), device=self.device), column]

    @torch.inference_mode()
    def decode(
        self,
        slots: list[int],
        tokens: list[int],
        positions: list[int],
        carried: torch.Tensor | None = None,
        carried_rows: list[int] | None = None,
        rope_deltas: list[int] | None = None,
    ) -> torch.Tensor:
        """One new token per slot, each at its own position; returns logits [B, V].

        With ``rope_deltas`` (a vision-language model's rows, one per row: 0 for a text-only
        sequence) row ``i`` rotates at ``positions[i] + rope_deltas[i]`` on the three rotary axes.

        With ``carried`` (token ids on the device, the previous step's samples) and ``carried_rows``,
        row ``i`` takes ``carried[carried_rows[i]]`` where that index is >= 0, and ``tokens[i]``
        otherwise: the overlapped engine feeds a step's samples to the next step without reading
        them back first."""
        kv_len = max(positions) + 1
        if kv_len > self.max_len:
            raise InferenceError(f"decode at position {kv_len - 1} is outside the context of {self.max_len}")
        pos = host_to_device(positions, torch.long, self.device).view(-1, 1)
        view = BatchCacheView(self.cache, slots, positions, kv_len)
        masks = self._masks(pos, kv_len, trivial=(min(positions) == kv_len - 1))
        ids = host_to_device(tokens, torch.long, self.device)
        if carried is not None and carried_rows is not None:
            ids = take_carried(ids, carried, host_to_device(carried_rows, torch.long, self.device))
        rotary = pos
        if rope_deltas is not None and any(rope_deltas):
            deltas = host_to_device(rope_deltas, torch.long, self.device).view(-1, 1)
            rotary = (pos + deltas).unsqueeze(0).expand(3, -1, -1)
        logits = self._forward(ids.view(-1, 1), rotary, view, masks, 1)
        for slot, p in zip(slots, positions):
            self.cache.lengths[slot] = p + 1
        self._last_decode = (slots, rope_deltas)
        return logits[:, -1]

    def decode_again(self, carried: torch.Tensor) -> torch.Tensor:
        """Decode the rows of the last :meth:`decode` call once more, each one position further on
        and each taking its input token from its own row of ``carried`` (the tokens that call's
        logits were sampled to, still on the device); returns logits [B, V].

        The overlapped engine's steady steps (``decode_step.py``) call this: a runner may then skip
        rebuilding the step's inputs on the host (:class:`~.cuda_graph.GraphModelRunner` advances
        its device buffers in place). Here it is :meth:`decode` with those inputs: each row's
        position is the length its slot's cache has reached."""
        slots, rope_deltas = self._last_decode
        if not slots:
            raise InferenceError("decode_again needs a decode call before it")
        lengths, rows = self.cache.lengths, list(range(len(slots)))
        extra = {"rope_deltas": rope_deltas} if rope_deltas is not None else {}
        return self.decode(slots, [0] * len(slots), [lengths[s] for s in slots], carried, rows, **extra)

    # ---- weights ----
    def _weight_targets(self) -> dict[str, torch.Tensor]:
        """Every name a checkpoint may use for a served tensor (tied aliases included) -> the tensor.

        Kept per model object: updates copy into these tensors in place, so the map stays valid,
        and walking the state dict on every update cost milliseconds of a paused server.
        """
        if self._targets_model is not self.model:
            targets = dict(self.model.named_parameters(remove_duplicate=False))
            persistent = self.model.state_dict().keys()
            targets.update({n: b for n, b in self.model.named_buffers(remove_duplicate=False) if n in persistent})
            self._targets, self._targets_model = targets, self.model
        return self._targets

    def weight_specs(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Name -> (shape, dtype) of every tensor a weight update may replace (parameters and buffers)."""
        return {name: (tuple(t.shape), t.dtype) for name, t in self._weight_targets().items()}

    def required_weight_names(self) -> set[str]:
        """Parameters a full checkpoint must carry (a tied alias counts once, under its first name)."""
        return {name for name, _ in self.model.named_parameters()}

    @torch.inference_mode()
    def load_weights(self, named: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy already validated tensors into the model in place; returns how many were copied.

        Tensors already on the target's device in its dtype (a collective update's) are copied by
        one ``_foreach_copy_`` call, the rest one by one (converted first)."""
        targets = self._weight_targets()
        same: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        count = 0
        for name, tensor in named:
            target = targets[name]
            if tensor.device == target.device and tensor.dtype == target.dtype:
                same[0].append(target)
                same[1].append(tensor)
            else:
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
            count += 1
        if same[0]:
            torch._foreach_copy_(same[0], same[1])
        return count
