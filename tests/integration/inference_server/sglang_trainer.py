"""A stand-in for the trainer side of SGLang's collective weight update (rank 0 of the group).

Run as a script: ``python sglang_trainer.py --port P --group G --per-tensor DIR --bucket DIR``. It
builds the group exactly as SGLang's ``init_custom_process_group`` (TCP rendezvous hosted here,
``PrefixStore(group)``, torch's process-group helper), then sends two updates: the safetensors of
``--per-tensor`` as one broadcast per tensor in sorted-name order, and those of ``--bucket`` as one
flattened ``uint8`` broadcast (tensors back to back in sorted-name order). It is what any
SGLang-compatible trainer does; the test drives the server side over HTTP at the same time.
"""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.distributed_c10d import _new_process_group_helper, _world, rendezvous

logger = logging.getLogger(__name__)


def ordered_state(model_dir: Path) -> list[tuple[str, torch.Tensor]]:
    """The model's tensors in sorted-name order (the order both sides agree on)."""
    state: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return sorted(state.items())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--per-tensor", type=Path, required=True)
    parser.add_argument("--bucket", type=Path, required=True)
    args = parser.parse_args()
    timeout = timedelta(seconds=120)
    store, rank, world = next(rendezvous(f"tcp://127.0.0.1:{args.port}", 0, args.world_size, timeout=timeout))
    store = dist.PrefixStore(args.group, store)
    group, _ = _new_process_group_helper(
        world, rank, [], dist.Backend("gloo"), store, group_name=args.group, timeout=timeout
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world)}
    for _, tensor in ordered_state(args.per_tensor):
        dist.broadcast(tensor.contiguous(), src=0, group=group)
    flat = torch.cat([t.contiguous().view(-1).view(torch.uint8) for _, t in ordered_state(args.bucket)])
    dist.broadcast(flat, src=0, group=group)
    dist.destroy_process_group(group)
    logger.info("trainer sent both updates")


if __name__ == "__main__":
    main()
