"""One packed micro-batch through the model: per-token log-probs/entropy (actor) or values (critic).

The micro-batch is fed as a single row ``[1, T]`` with per-sequence ``position_ids`` and the
sequence bounds in the model kwargs (``cu_seq_lens_q``...). Without sequence parallelism,
transformers' own SDPA/eager detect the packing from the position ids (attention mask ``None``) and
build a block-diagonal causal mask; flash-attention varlen uses the bounds.
With Ulysses (``sp > 1``), each rank feeds its contiguous ``T/sp`` slice and passes the global
``cu_seqlens`` to the ``areal_ulysses`` attention; per-position scores are gathered back to ``[T]``
before they are aligned to tokens.

A vision-language model (:mod:`areal_tasks.engine.vision`) gets the micro-batch's images and its
3-D rotary positions ``[4, 1, T]`` (per-sequence text positions first) instead of the plain ones;
with ``ensure_image`` (FSDP over several ranks, in a backward) a micro-batch without images gets a
dummy one, cut off again, so that every rank's vision tower has gradients to reduce.

Actor scores come from the chunked fused LM head when the engine installed one
(:mod:`areal_tasks.kernels.lm_head`: the model's forward returns per-position log-prob/entropy
instead of logits), else from the full logits (:func:`next_token_stats`). Nothing here reads a
device value back to the host when the caller passes the host copy of the sequence bounds.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.api.batch import CU_SEQLENS, IMAGE_GRID_THW, INPUT_IDS, POSITION_IDS
from areal_tasks.engine.parallel.ulysses import SP_GROUP_KWARG, gather_sequence
from areal_tasks.errors import EngineError
from areal_tasks.kernels.attention import BOUNDS_KWARG
from areal_tasks.kernels.logprobs import align_to_tokens, next_token_labels, next_token_stats
from areal_tasks.models.critic import values_per_position

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from areal_tasks.engine.vision import VLMInputs
    from areal_tasks.kernels.lm_head import ChunkedLMHead

logger = logging.getLogger(__name__)


@dataclass
class ForwardSpec:
    """What a forward pass computes."""

    #: ``actor`` (log-probs over the vocabulary) or ``critic`` (value head).
    role: str
    #: logits are divided by this before log-softmax (the sampling temperature).
    temperature: float = 1.0
    #: let gradients flow through the entropy (entropy bonus); otherwise it is detached.
    grad_entropy: bool = False


class MicroBatchForward:
    """Runs the model on packed micro-batches for one rank (optionally one of ``sp`` Ulysses ranks)."""

    def __init__(
        self,
        model: torch.nn.Module,
        spec: ForwardSpec,
        sp_group: ProcessGroup | None,
        lm_head: ChunkedLMHead | None = None,
        *,
        host_bounds: bool = True,
        vision: VLMInputs | None = None,
        ensure_image: bool = False,
    ) -> None:
        """``host_bounds``: pass the host copy of the sequence bounds to the attention (the CPU
        per-sequence path and Ulysses use it); off for compiled whole blocks, which take
        ``max_length_q`` and the ``cu_seq_lens_q`` tensor only. ``vision``: the model is a VLM
        (its inputs); ``ensure_image``: with gradients on, run the vision tower on a dummy image
        where a micro-batch has none (module docstring)."""
        import torch.distributed as dist

        if vision is not None and sp_group is not None and dist.get_world_size(sp_group) > 1:
            raise EngineError("vision-language models do not run under sequence parallelism (sp > 1); use dp")

        self.model = model
        #: the chunked fused head installed in ``model`` (actor only), or None for the full logits.
        self.lm_head = lm_head if spec.role == "actor" else None
        self.spec = spec
        self.sp_group = sp_group
        self.sp = 1 if sp_group is None else dist.get_world_size(sp_group)
        self.sp_rank = 0 if sp_group is None else dist.get_rank(sp_group)
        self.host_bounds = host_bounds
        self.vision = vision
        self.ensure_image = ensure_image

    def __call__(
        self, mb: dict[str, torch.Tensor], *, with_entropy: bool = False, bounds: tuple[int, ...] | None = None
    ) -> dict[str, torch.Tensor]:
        """``{"logprobs", "entropy"?}`` or ``{"values"}``, each ``[T]`` aligned to the tokens of ``mb``.

        ``bounds``: ``mb``'s ``cu_seqlens`` as host integers (read from the device when omitted).
        """
        import torch

        if bounds is None:
            bounds = tuple(int(b) for b in mb[CU_SEQLENS].tolist())
        vision = self.vision
        if vision is None and IMAGE_GRID_THW in mb and mb[IMAGE_GRID_THW].shape[0] > 0:
            raise EngineError(
                f"the micro-batch carries {mb[IMAGE_GRID_THW].shape[0]} images, but the model is not a "
                "vision-language model; train a VLM (qwen2_vl, qwen2_5_vl) or drop the images"
            )
        if vision is not None and self.ensure_image and torch.is_grad_enabled() and vision.needs_dummy_image(mb):
            n_tokens = mb[INPUT_IDS].shape[0]
            padded, padded_bounds = vision.with_dummy_image(mb, bounds)
            out = self._forward(padded, with_entropy, padded_bounds)
            return {key: value[:n_tokens] for key, value in out.items()}
        return self._forward(mb, with_entropy, bounds)

    def _forward(
        self, mb: dict[str, torch.Tensor], with_entropy: bool, bounds: tuple[int, ...]
    ) -> dict[str, torch.Tensor]:
        import torch

        ids, cu = mb[INPUT_IDS], mb[CU_SEQLENS]
        positions = mb[POSITION_IDS]
        total = ids.shape[0]
        labels = next_token_labels(ids)
        max_len = max(b - a for a, b in itertools.pairwise(bounds))
        cu32 = cu.to(torch.int32)
        # the global sequence bounds, for the engine's attentions (and flash-attention varlen)
        kwargs: dict[str, Any] = {
            "cu_seq_lens_q": cu32,
            "cu_seq_lens_k": cu32,
            "max_length_q": max_len,
            "max_length_k": max_len,
        }
        if self.host_bounds:
            kwargs[BOUNDS_KWARG] = bounds
        if self.sp > 1:
            if total % self.sp != 0:
                raise EngineError(
                    f"a micro-batch of {total} tokens cannot be split over sp={self.sp} ranks; "
                    "micro_batch.pad_to_multiple_of must be a multiple of sp"
                )
            local = total // self.sp
            part = slice(self.sp_rank * local, (self.sp_rank + 1) * local)
            ids, positions, labels = ids[part], positions[part], labels[part]
            kwargs[SP_GROUP_KWARG] = self.sp_group
        inputs = {"input_ids": ids.unsqueeze(0), "position_ids": positions.unsqueeze(0), "use_cache": False, **kwargs}
        if self.vision is not None:
            inputs.update(self.vision.model_inputs(mb, bounds))
        if self.spec.role == "critic":
            out = self.model(**inputs)
            return {"values": align_to_tokens(self._gather(values_per_position(out.logits)), cu)}
        if self.lm_head is not None:
            return self._fused(inputs, labels, cu, with_entropy)
        out = self.model(**inputs)
        logits = out.logits[0]
        want_entropy = with_entropy and self.spec.grad_entropy
        logprob, entropy = next_token_stats(
            logits, labels, temperature=self.spec.temperature, with_entropy=want_entropy
        )
        result = {"logprobs": align_to_tokens(self._gather(logprob), cu)}
        if with_entropy:
            if entropy is None:
                with torch.no_grad():
                    _, entropy = next_token_stats(
                        logits.detach(), labels, temperature=self.spec.temperature, with_entropy=True
                    )
            result["entropy"] = align_to_tokens(self._gather(entropy), cu)
        return result

    def _fused(
        self, inputs: dict[str, Any], labels: torch.Tensor, cu: torch.Tensor, with_entropy: bool
    ) -> dict[str, torch.Tensor]:
        """Scores from the chunked head: the model's ``logits`` output is ``[1, N, 1 or 2]`` stats."""
        with self.lm_head.scoring(
            labels, temperature=self.spec.temperature, with_entropy=with_entropy, entropy_grad=self.spec.grad_entropy
        ):
            stats = self.model(**inputs).logits[0]
        result = {"logprobs": align_to_tokens(self._gather(stats[:, 0]), cu)}
        if with_entropy:
            entropy = stats[:, 1] if self.spec.grad_entropy else stats[:, 1].detach()
            result["entropy"] = align_to_tokens(self._gather(entropy), cu)
        return result

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        return local if self.sp == 1 else gather_sequence(local, self.sp_group)
