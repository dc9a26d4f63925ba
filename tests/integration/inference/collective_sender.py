"""The trainer side of a collective weight update, exactly as docs/inference.md prescribes (what
SGLang 0.5.23 receives): rank 0 of a group built like SGLang's ``init_custom_process_group``,
one ``uint8`` broadcast per bucket of :func:`plan_weight_buckets`, tensors back to back in the
bucket's order, no header and no end marker."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.engine.weights.disk import read_safetensors_dir
from areal_tasks.launch.ports import PortAllocator


def join_as_trainer(meta: WeightUpdateMeta) -> dist.ProcessGroup:
    """Rank 0 of the weight-update group, built the way SGLang builds the servers' side."""
    from torch.distributed.distributed_c10d import _new_process_group_helper, _world, rendezvous

    timeout = timedelta(seconds=meta.timeout_s)
    url = f"tcp://{meta.master_addr}:{meta.master_port}"
    store, rank, world_size = next(rendezvous(url, 0, meta.world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(meta.group_name, store)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], dist.Backend(meta.backend), store, group_name=meta.group_name, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


class CollectiveTrainer:
    """Named tensors to publish, their bucket plan, and a background sender."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_servers: int, bucket_bytes: int) -> None:
        self.tensors = tensors
        self.n_servers = n_servers
        self.bucket_bytes = bucket_bytes
        specs = [ParamSpec(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in tensors.items()]
        self.buckets = plan_weight_buckets(specs, bucket_bytes)
        self.port = PortAllocator().allocate(1)[0]

    @classmethod
    def from_model_dir(cls, path: Path, scale: float, n_servers: int, bucket_bytes: int = 1 << 20) -> CollectiveTrainer:
        state = read_safetensors_dir(path)
        scaled = {k: (v * scale).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}
        return cls(scaled, n_servers, bucket_bytes)

    def meta(self, version: int) -> WeightUpdateMeta:
        return WeightUpdateMeta.collective(
            version, "127.0.0.1", self.port, 1 + self.n_servers, group_name=f"suite-{uuid.uuid4().hex[:8]}",
            backend="gloo", bucket_bytes=self.bucket_bytes, timeout_s=120.0,
        )

    def send(self, meta: WeightUpdateMeta) -> None:
        pg = join_as_trainer(meta)
        for bucket in self.buckets:
            flat = torch.cat([self.tensors[p.name].contiguous().view(-1).view(torch.uint8) for p in bucket])
            dist.broadcast(flat, src=0, group=pg)
        dist.destroy_process_group(pg)

    @contextlib.contextmanager
    def sending(self, meta: WeightUpdateMeta) -> Iterator[None]:
        """Send in a background thread while the body drives the servers; re-raise its failure."""
        errors: list[BaseException] = []

        def target() -> None:
            try:
                self.send(meta)
            except BaseException as exc:  # reported to the test below
                errors.append(exc)

        thread = threading.Thread(target=target, name="collective-trainer", daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join(timeout=meta.timeout_s)
        if thread.is_alive():
            raise AssertionError("the trainer's broadcast did not finish")
        if errors:
            raise errors[0]
