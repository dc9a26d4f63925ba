"""The collective transport's sender against its receiving side (SGLang's protocol).

The trainer's ``BucketedBroadcastSender`` and a server's ``CollectiveReceiver`` meet over a
loopback stand-in for ``torch.distributed.broadcast`` (the real gloo group, which needs one process
per member, is exercised by ``tests/distributed/test_fsdp_weight_update.py``, the transport contract
test and the inference protocol suite): each bucket of the shared plan is exactly one ``uint8``
broadcast, with no header and no end marker, and the server rebuilds every tensor from the plan's
names, dtypes and shapes. Also: the sender refuses a stream that differs from the plan.
"""

from __future__ import annotations

import pytest
import torch

from areal_tasks.api.inference import ParamSpec, plan_weight_buckets
from areal_tasks.api.weight_update import WeightUpdateMeta
from areal_tasks.errors import WeightTransportError
from areal_tasks.weights.base import WeightLoad
from areal_tasks.weights.buckets import flatten_bucket, spec_of
from areal_tasks.weights.collective import BucketedBroadcastSender, CollectiveReceiver
from areal_tasks.weights.group import WeightGroup, join_as_trainer

BUCKET_BYTES = 256


class Loopback:
    """``dist.broadcast`` for one sender (group ``"trainer"``) and its receivers in this process."""

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []
        self.read = 0

    def broadcast(self, tensor: torch.Tensor, src: int, group: str, async_op: bool = False) -> None:
        assert src == 0 and not async_op
        if group == "trainer":
            self.sent.append(tensor.clone())
        else:
            assert tensor.dtype == torch.uint8 and tensor.shape == self.sent[self.read].shape
            tensor.copy_(self.sent[self.read])
            self.read += 1


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch) -> Loopback:
    loop = Loopback()
    monkeypatch.setattr(torch.distributed, "broadcast", loop.broadcast)
    return loop


def _trainer_group() -> WeightGroup:
    return WeightGroup("g", 0, 2, "gloo", torch.device("cpu"), "trainer")


def _tensors(version: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(version)
    return {  # a bf16 tensor of odd length before 4- and 8-byte ones: only the plan's order aligns them
        "a.bf16": torch.randn(33, generator=gen).to(torch.bfloat16),
        "b.weight": torch.randn(7, 5, generator=gen),
        "c.int": torch.arange(3, dtype=torch.int64) + version,
        "d.big": torch.randn(300, generator=gen),  # 1200 bytes > the bucket
        "e.empty": torch.zeros(0, 4),
        "f.scalar": torch.tensor(float(version)),
        "g.half": torch.randn(3, generator=gen).to(torch.float16),
    }


def test_each_planned_bucket_is_one_broadcast_the_server_receives(loopback: Loopback) -> None:
    sender = BucketedBroadcastSender(_trainer_group(), BUCKET_BYTES)
    server = CollectiveReceiver(torch.device("cpu"))
    server.groups["g"] = WeightGroup("g", 1, 2, "gloo", torch.device("cpu"), "server")
    for version in (1, 2):
        tensors = _tensors(version)
        specs = [spec_of(n, t) for n, t in tensors.items()]
        buckets = plan_weight_buckets(specs, BUCKET_BYTES)  # what the client posts
        assert sender.plan(specs) == buckets and len(buckets) > 1
        start = len(loopback.sent)
        sent = sender.send(tensors.items(), specs)
        assert len(loopback.sent) - start == len(buckets)
        assert sent == sum(t.numel() * t.element_size() for t in tensors.values())
        received: dict[str, torch.Tensor] = {}
        for bucket in buckets:
            received.update(server.receive(WeightLoad.for_specs(bucket, group_name="g")))
        assert loopback.read == len(loopback.sent)
        assert set(received) == set(tensors)
        for name, tensor in tensors.items():
            assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), (version, name)


def test_a_bucket_is_its_tensors_bytes_back_to_back() -> None:
    a, b = torch.tensor([1.0], dtype=torch.float32), torch.tensor([2], dtype=torch.int16)
    flat = flatten_bucket([spec_of("a", a), spec_of("b", b)], {"b": b, "a": a}, torch.device("cpu"))
    assert flat.dtype == torch.uint8
    assert flat.tolist() == a.view(torch.uint8).tolist() + b.view(torch.uint8).tolist()


def test_a_floating_point_tensor_is_cast_to_its_planned_dtype_in_the_bucket() -> None:
    master = torch.tensor([1.0, -2.5, 3.1415926], dtype=torch.float32)  # an fp32 master weight, bf16 on the wire
    flat = flatten_bucket([ParamSpec("w", "bfloat16", (3,))], {"w": master}, torch.device("cpu"))
    assert flat.numel() == 6
    assert torch.equal(flat.view(torch.bfloat16), master.to(torch.bfloat16))


@pytest.mark.parametrize(
    ("stream", "match"),
    [
        ({"a": torch.zeros(4), "x": torch.zeros(4)}, "gave 'x'"),
        ({"a": torch.zeros(4)}, "ended before"),
        ({"a": torch.zeros(4), "b": torch.zeros(4), "c": torch.zeros(1)}, "beyond"),
        ({"a": torch.zeros(4), "b": torch.zeros(4, dtype=torch.int32)}, "plan says"),
        ({"a": torch.zeros(4), "b": torch.zeros(2, 2)}, "plan says"),
    ],
)
def test_a_stream_that_differs_from_the_plan_is_refused(loopback: Loopback, stream: dict, match: str) -> None:
    specs = [spec_of("a", torch.zeros(4)), spec_of("b", torch.zeros(4))]
    with pytest.raises(WeightTransportError, match=match):
        BucketedBroadcastSender(_trainer_group(), 16).send(stream.items(), specs)


def test_join_needs_a_collective_meta_and_the_sender_a_bucket_size() -> None:
    with pytest.raises(WeightTransportError, match="collective"):
        join_as_trainer(WeightUpdateMeta.disk("/tmp/x", 1), torch.device("cpu"))
    with pytest.raises(WeightTransportError, match="bucket_bytes"):
        BucketedBroadcastSender(_trainer_group(), 0)
