"""RL batches: trajectories packed into the layout of ``api/batch.py``, and per-token outputs that the
data-parallel ranks computed on their shares put back into the whole batch.

:func:`pack_trajectories` concatenates the trajectories in order: ``input_ids``, ``loss_mask``,
behaviour ``logprobs``, per-token ``versions``, per-sequence ``rewards`` and ``group_ids`` (one id per
``group_size`` consecutive samples) and ``seq_policy_version`` (the trainer's version this step).
Trajectories of a vision-language model add their images (``Trajectory.multimodal``) as
``pixel_values``, ``image_grid_thw`` and ``seq_n_images`` (``engine/image_rows.py``).

Every rank packs the same batch and computes the same :func:`share_of` partition, trains on its own
share, and exchanges the per-token tensors it computed (proximal, reference log-probs, values) with
:func:`gather_token_outputs`, so the advantages are computed on the whole batch on every rank
(batch-level normalisation then means the same thing whatever the data-parallel size).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from areal_tasks.algo import keys
from areal_tasks.api.batch import INPUT_IDS, POSITION_IDS
from areal_tasks.errors import AlgorithmError

if TYPE_CHECKING:
    import torch

    from areal_tasks.api.train_engine import ParallelInfo
    from areal_tasks.api.workflow import Trajectory

Batch = dict[str, "torch.Tensor"]


def pack_trajectories(trajectories: Sequence[Trajectory], group_size: int, policy_version: int) -> Batch:
    """The packed batch of ``trajectories`` (groups of ``group_size`` consecutive samples)."""
    import torch

    from areal_tasks.engine.image_rows import pack_images
    from areal_tasks.errors import EngineError

    if not trajectories:
        raise AlgorithmError("cannot train on an empty list of trajectories")
    if len(trajectories) % group_size:
        raise AlgorithmError(f"{len(trajectories)} trajectories do not split into groups of {group_size}")
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    positions: list[int] = []
    cu = [0]
    for traj in trajectories:
        traj.validate()
        ids += traj.input_ids
        mask += traj.loss_mask
        logprobs += traj.logprobs
        versions += traj.versions
        positions += range(len(traj.input_ids))
        cu.append(cu[-1] + len(traj.input_ids))
    n = len(trajectories)
    try:
        images = pack_images([traj.multimodal for traj in trajectories])
    except EngineError as exc:
        raise AlgorithmError(f"cannot pack the trajectories' images: {exc}") from exc
    return {
        INPUT_IDS: torch.tensor(ids, dtype=torch.long),
        keys.CU_SEQLENS: torch.tensor(cu, dtype=torch.int32),
        POSITION_IDS: torch.tensor(positions, dtype=torch.long),
        keys.LOSS_MASK: torch.tensor(mask, dtype=torch.int32),
        keys.LOGPROBS: torch.tensor(logprobs, dtype=torch.float32),
        keys.VERSIONS: torch.tensor(versions, dtype=torch.long),
        keys.REWARDS: torch.tensor([float(t.reward) for t in trajectories], dtype=torch.float32),
        keys.GROUP_IDS: torch.arange(n, dtype=torch.long) // group_size,
        keys.POLICY_VERSION: torch.full((n,), policy_version, dtype=torch.long),
        **images,
    }


def share_of(batch: Mapping[str, torch.Tensor], info: ParallelInfo, group_size: int) -> list[list[int]]:
    """Sequence indices of every data-parallel rank (groups kept whole, balanced by tokens)."""
    from areal_tasks.engine.microbatch import dp_partition

    if info.dp_size == 1:
        return [list(range(int(batch[keys.CU_SEQLENS].numel()) - 1))]
    return dp_partition(batch, info.dp_size, granularity=group_size)


def gather_token_outputs(
    batch: Mapping[str, torch.Tensor],
    parts: Sequence[Sequence[int]],
    info: ParallelInfo,
    local: Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """Whole-batch per-token tensors from every data-parallel rank's ``local`` outputs on its share.

    ``local[key]`` is ``[T_share]`` in the order of ``parts[info.dp_rank]``; the result is ``[T]`` in
    batch order. A collective over the default group when there is more than one rank.
    """
    import torch
    import torch.distributed as dist

    cu = batch[keys.CU_SEQLENS].tolist()
    total = cu[-1]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        mine = (info.dp_rank, info.is_dp_head, {k: v.detach().cpu() for k, v in local.items()})
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        by_rank = {dp_rank: outputs for dp_rank, head, outputs in everyone if head}
    else:
        by_rank = {0: {k: v.detach().cpu() for k, v in local.items()}}
    if sorted(by_rank) != list(range(len(parts))):
        raise AlgorithmError(f"expected outputs of data-parallel ranks 0..{len(parts) - 1}, got {sorted(by_rank)}")
    out: dict[str, torch.Tensor] = {}
    for key in local:
        full = torch.zeros(total, dtype=local[key].dtype)
        for dp_rank, seqs in enumerate(parts):
            values, offset = by_rank[dp_rank][key], 0
            expected = sum(cu[i + 1] - cu[i] for i in seqs)
            if values.numel() != expected:
                raise AlgorithmError(f"rank {dp_rank} returned {values.numel()} {key!r} values for {expected} tokens")
            for i in seqs:
                full[cu[i] : cu[i + 1]] = values[offset : offset + cu[i + 1] - cu[i]]
                offset += cu[i + 1] - cu[i]
        out[key] = full
    return out
