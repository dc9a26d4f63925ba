"""The trainer side of a collective weight update for the inference tests: the product sender
(:mod:`areal_tasks.weights.collective`, SGLang's protocol) publishing a fixed set of tensors.

Rank 0 joins the group as SGLang's ``init_custom_process_group`` does and broadcasts one ``uint8``
tensor per bucket of :func:`plan_weight_buckets`, tensors back to back in the bucket's order, no
header and no end marker; :attr:`CollectiveTrainer.buckets` is the same plan, for the client.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import torch

from areal_tasks.api.inference import plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.launch.ports import PortAllocator
from areal_tasks.models.safetensors_dir import read_safetensors_dir
from areal_tasks.weights.buckets import spec_of
from areal_tasks.weights.collective import BucketedBroadcastSender
from areal_tasks.weights.group import join_as_trainer


class CollectiveTrainer:
    """Named tensors to publish, their bucket plan, and a background sender."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_servers: int, bucket_bytes: int) -> None:
        self.tensors = tensors
        self.n_servers = n_servers
        self.bucket_bytes = bucket_bytes
        self.specs = [spec_of(n, t) for n, t in tensors.items()]
        self.buckets = plan_weight_buckets(self.specs, bucket_bytes)
        self.port = PortAllocator().allocate(1)[0]

    @classmethod
    def from_model_dir(cls, path: Path, scale: float, n_servers: int, bucket_bytes: int = 1 << 20) -> CollectiveTrainer:
        state = read_safetensors_dir(path)
        scaled = {k: (v * scale).to(v.dtype) if v.is_floating_point() else v for k, v in state.items()}
        return cls(scaled, n_servers, bucket_bytes)

    def meta(self, version: int) -> WeightUpdateMeta:
        return WeightUpdateMeta.collective(
            version,
            "127.0.0.1",
            self.port,
            1 + self.n_servers,
            group_name=f"suite-{uuid.uuid4().hex[:8]}",
            backend="gloo",
            bucket_bytes=self.bucket_bytes,
            timeout_s=120.0,
        )

    def send(self, meta: WeightUpdateMeta) -> None:
        """Join the group of ``meta`` as rank 0, broadcast every bucket once, leave the group."""
        group = join_as_trainer(meta, torch.device("cpu"))
        try:
            BucketedBroadcastSender(group, meta.bucket_bytes).send(self.tensors.items(), self.specs)
        finally:
            group.destroy()

    @contextlib.contextmanager
    def sending(self, meta: WeightUpdateMeta) -> Iterator[None]:
        """Send in a background thread while the body drives the servers; re-raise its failure."""
        errors: list[BaseException] = []

        def target() -> None:
            try:
                self.send(meta)
            except BaseException as exc:  # noqa: BLE001 - reported to the test below
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
