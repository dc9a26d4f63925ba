"""Bucketed broadcast over a gloo weight-update group: a sender and two receivers (threads of this
process, each its own group member) exchange mixed-dtype tensors, some bigger than a bucket,
over two consecutive updates on the same group."""

from __future__ import annotations

import threading

import pytest
import torch

from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.engine.weights.collective import BucketedBroadcastSender, join_weight_group, receive_weights
from areal_tasks.errors import EngineError


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tensors(version: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(version)
    return {
        "a.weight": torch.randn(7, 5, generator=gen),
        "b.bf16": torch.randn(33, generator=gen).to(torch.bfloat16),
        "c.big": torch.randn(300, generator=gen),  # 1200 bytes > the 256-byte bucket
        "d.int": torch.arange(3, dtype=torch.int64) + version,
        "e.empty": torch.zeros(0, 4),
        "f.scalar": torch.tensor(float(version)),
    }


def test_two_updates_reach_every_receiver():
    meta = WeightUpdateMeta.collective(1, "127.0.0.1", _free_port(), 3, bucket_bytes=256, timeout_s=60)
    received: dict[int, list[dict]] = {1: [], 2: []}
    errors: list[BaseException] = []

    def receiver(rank: int) -> None:
        try:
            group = join_weight_group(meta, rank)
            for version in (1, 2):
                received[rank].append(dict(receive_weights(group, expected_version=version)))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            raise

    threads = [threading.Thread(target=receiver, args=(r,), daemon=True) for r in (1, 2)]
    for t in threads:
        t.start()
    group = join_weight_group(meta, 0)
    sender = BucketedBroadcastSender(group, meta.bucket_bytes)
    sent = [sender.send(_tensors(v).items(), version=v) for v in (1, 2)]
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sent[0] == sum(t.numel() * t.element_size() for t in _tensors(1).values())
    for rank in (1, 2):
        for version, got in zip((1, 2), received[rank]):
            expected = _tensors(version)
            assert list(got) == list(expected)
            for name, tensor in expected.items():
                assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), (rank, version, name)


def test_roles_are_checked():
    meta = WeightUpdateMeta.disk("/tmp/x", 1)
    with pytest.raises(EngineError, match="collective"):
        join_weight_group(meta, 0)
    coll = WeightUpdateMeta.collective(1, "127.0.0.1", 1234, 2)
    with pytest.raises(EngineError, match="outside"):
        join_weight_group(coll, 2)
