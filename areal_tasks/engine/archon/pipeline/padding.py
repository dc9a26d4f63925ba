"""Our packed micro-batches, padded to one length for a pipeline step, and what each stage is given.

A pipeline sends tensors of one fixed shape between stages, so every micro-batch of a step is padded
to the same number of tokens ``T_pad`` (the longest, rounded up to ``pad_to_multiple_of``). The pad
tokens form their own sequence at the end (one more ``cu_seqlens`` entry), so they attend only to
each other; ``token_mask`` is False on them (MoE statistics skip them) and their outputs are cut off
before the loss sees anything. A micro-batch the schedule needed but the batch did not have (see
``schedule.micro_batch_count``) is all padding and has ``n_real == 0``.

Only the token ids travel through the schedule as a stacked ``[n_mb, T_pad]`` tensor; the rest of a
micro-batch (sequence bounds, positions, labels) stays here, looked up by its index on every stage,
so sequence bounds of different lengths never need stacking.

With context parallelism (``cp`` ranks, Ulysses) each rank keeps its contiguous ``T_pad / cp`` slice
of the per-token tensors (ids, positions, labels, mask) while the sequence bounds stay global (the
attention runs on the whole row after its all-to-all); the last stage's scores are gathered back
to ``T_pad`` and the MoE statistics summed over the ``cp`` ranks before the loss sees them.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from areal_tasks.api.batch import CU_SEQLENS, INPUT_IDS, POSITION_IDS
from areal_tasks.errors import EngineError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


@dataclass
class PaddedMicroBatch:
    """One micro-batch of a pipeline step, padded to the step's length."""

    #: the caller's micro-batch (None for a padding micro-batch the schedule needed).
    mb: dict[str, torch.Tensor] | None
    #: real tokens (the micro-batch's own, padding excluded).
    n_real: int
    #: ``[T_pad]`` token ids (pad: 0).
    input_ids: torch.Tensor
    #: ``[1, T_pad]`` per-sequence positions.
    position_ids: torch.Tensor
    #: ``[S + 1]`` int32 bounds including the pad sequence, and their host copy.
    cu_seqlens: torch.Tensor
    bounds: tuple[int, ...]
    #: ``[1, T_pad]`` next-token labels of the real tokens (pad: 0).
    labels: torch.Tensor
    #: ``[1, T_pad]`` True on real tokens.
    token_mask: torch.Tensor
    #: the micro-batch's own ``cu_seqlens`` (to align the last stage's outputs), on the device.
    cu_real: torch.Tensor | None


def padded_length(micro_batches: Sequence[dict[str, Any]], multiple: int = 1) -> int:
    """The longest micro-batch's token count rounded up to ``multiple``."""
    longest = max(int(mb[INPUT_IDS].shape[0]) for mb in micro_batches)
    return -(-longest // multiple) * multiple


def pad_micro_batches(
    micro_batches: Sequence[dict[str, torch.Tensor]],
    n_total: int,
    length: int,
    device: torch.device,
    *,
    cp: int = 1,
    cp_rank: int = 0,
) -> list[PaddedMicroBatch]:
    """``micro_batches`` padded to ``length`` tokens, plus ``n_total - len(micro_batches)`` all-pad
    ones; with ``cp`` > 1 the per-token tensors are this context-parallel rank's slice."""
    if length % cp:
        raise EngineError(f"the padded length {length} is not a multiple of the context-parallel size c{cp}")
    part = slice(cp_rank * (length // cp), (cp_rank + 1) * (length // cp))
    import torch

    from areal_tasks.engine.microbatch import position_ids_from_cu_seqlens
    from areal_tasks.kernels.logprobs import next_token_labels

    out = []
    for k in range(n_total):
        mb = micro_batches[k] if k < len(micro_batches) else None
        if mb is None:
            ids = torch.zeros(0, dtype=torch.long)
            cu = torch.zeros(1, dtype=torch.int32)
            bounds: list[int] = [0]
            positions = torch.zeros(0, dtype=torch.long)
        else:
            ids = mb[INPUT_IDS]
            cu = mb[CU_SEQLENS]
            bounds = [int(b) for b in cu.tolist()]
            if bounds[0] != 0 or bounds[-1] != ids.shape[0] or any(b < a for a, b in itertools.pairwise(bounds)):
                raise EngineError(f"micro-batch {k}: cu_seqlens {bounds} do not bound its {ids.shape[0]} tokens")
            positions = mb.get(POSITION_IDS)
            if positions is None:
                positions = position_ids_from_cu_seqlens(cu)
        n = int(ids.shape[0])
        if n > length:
            raise EngineError(f"micro-batch {k} has {n} tokens, more than the step's padded length {length}")
        pad = length - n
        labels = next_token_labels(ids) if n else ids
        full_bounds = (*bounds, length) if pad else tuple(bounds)
        out.append(
            PaddedMicroBatch(
                mb=mb,
                n_real=n,
                input_ids=_pad(ids.to(device=device, dtype=torch.long), pad, 0)[part],
                position_ids=torch.cat(
                    [positions.to(device=device, dtype=torch.long), torch.arange(pad, device=device)]
                )[part].unsqueeze(0),
                cu_seqlens=torch.tensor(full_bounds, dtype=torch.int32, device=device),
                bounds=full_bounds,
                labels=_pad(labels.to(device=device, dtype=torch.long), pad, 0)[part].unsqueeze(0),
                token_mask=(torch.arange(length, device=device) < n)[part].unsqueeze(0),
                cu_real=cu.to(device) if mb is not None else None,
            )
        )
    return out


def _pad(t: torch.Tensor, pad: int, value: int) -> torch.Tensor:
    import torch

    if not pad:
        return t
    return torch.cat([t, torch.full((pad,), value, dtype=t.dtype, device=t.device)])


def stage_kwargs(
    p: PaddedMicroBatch, *, is_last: bool, moe: bool, role: str, temperature: float, aux: Any = None
) -> dict[str, Any]:
    """The keyword arguments of a stage module's forward for micro-batch ``p`` (the decoder's contract)."""
    kwargs: dict[str, Any] = {"position_ids": p.position_ids, "cu_seqlens": p.cu_seqlens, "bounds": p.bounds}
    if moe:
        kwargs["aux"] = aux
        kwargs["token_mask"] = p.token_mask
    if is_last and role == "actor":
        kwargs["labels"] = p.labels
        kwargs["temperature"] = temperature
    return kwargs


def per_token_outputs(
    out: torch.Tensor,
    aux: torch.Tensor | None,
    p: PaddedMicroBatch,
    *,
    role: str,
    with_entropy: bool,
    grad_entropy: bool,
    cp_group: Any = None,
) -> dict[str, torch.Tensor]:
    """The last stage's ``[1, T_pad, 2 | 1]`` output -> the loss contract's per-token ``[T]`` outputs
    (aligned to the tokens as ``api/batch.py`` says), plus ``moe_aux`` ``[2, E]`` for MoE models.
    ``cp_group``: this rank holds a context-parallel slice (gathered, the statistics summed, here)."""
    import torch

    from areal_tasks.kernels.logprobs import align_to_tokens

    if p.cu_real is None:
        raise EngineError("a padding micro-batch has no outputs")
    if cp_group is not None:
        from areal_tasks.engine.archon.forward import sum_over_group
        from areal_tasks.engine.parallel.ulysses import gather_sequence

        columns = [gather_sequence(out[0, :, i].contiguous(), cp_group) for i in range(out.shape[-1])]
        out = torch.stack(columns, dim=-1).unsqueeze(0)
        aux = sum_over_group(aux, cp_group) if aux is not None else None
    head = out[0, : p.n_real]
    if role == "critic":
        result = {"values": align_to_tokens(head[:, 0].float(), p.cu_real)}
    else:
        result = {"logprobs": align_to_tokens(head[:, 0], p.cu_real)}
        if with_entropy:
            entropy = head[:, 1] if grad_entropy else head[:, 1].detach()
            result["entropy"] = align_to_tokens(entropy, p.cu_real)
    if aux is not None:
        result["moe_aux"] = aux
    return result
