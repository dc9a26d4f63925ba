"""Both ends of one weight update for the transport contract test, with nothing but the contract.

:class:`TinySource` is the smallest :class:`~areal_tasks.api.weights.WeightSource`: a few named
tensors on one rank, floating-point ones kept in fp32 (master weights) and published in bf16.
:func:`serve` is a server process: it takes the update the trainer's transport says the servers
get (its meta and bucket plan), opens the mode's receiver, receives every bucket checked against the
served model it is given, finishes the update, and saves what it got (or the error that refused it).
:class:`CheckpointSource` publishes a HF checkpoint's tensors under their on-disk names (per-expert
MoE weights, as the archon engine does). :func:`publish` is the trainer's side of one update.

Run as a script by the test: ``python transport_harness.py <request.json> <result.pt>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from areal_tasks.api.inference import ParamSpec
from areal_tasks.api.train_engine import ParallelInfo

#: the served dtype of every floating-point weight (the publish dtype of TinySource).
SERVED_FLOAT = torch.bfloat16


def tiny_tensors(seed: int) -> dict[str, torch.Tensor]:
    """Master weights of a tiny model: odd sizes, an integer buffer and a scalar, in a fixed order."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(11, 6, generator=gen),
        "norm.weight": torch.randn(7, generator=gen),  # an odd bf16 length before 4- and 8-byte tensors
        "positions": torch.arange(5, dtype=torch.int64) + seed,
        "layers.0.proj.weight": torch.randn(6, 6, generator=gen),
        "scale": torch.tensor(float(seed)),
    }


def published(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as the servers must get it (floating point in the publish dtype)."""
    return tensor.to(SERVED_FLOAT) if tensor.is_floating_point() else tensor


class TinySource:
    """A WeightSource on one rank (see the module doc)."""

    def __init__(self, seed: int = 1) -> None:
        self.tensors = tiny_tensors(seed)
        self.device = torch.device("cpu")
        self.model_path: str | None = None
        self.parallel = ParallelInfo(world_size=1, rank=0, dp_size=1, dp_rank=0)
        self.gathers = 0

    def weight_specs(self) -> list[ParamSpec]:
        return [
            ParamSpec(n, str(published(t).dtype).removeprefix("torch."), tuple(t.shape))
            for n, t in self.tensors.items()
        ]

    def iter_weights(self):
        self.gathers += 1
        yield from ((n, t.clone()) for n, t in self.tensors.items())  # fp32 masters: the transport casts

    def hf_config(self) -> Any:
        from transformers import PretrainedConfig

        return PretrainedConfig()


class CheckpointSource(TinySource):
    """A WeightSource on one rank publishing the tensors of the HF checkpoint ``model_dir`` in their
    on-disk names and dtypes (``drop``: names left out, specs and stream alike)."""

    def __init__(self, model_dir: Path, drop: str | None = None) -> None:
        from safetensors.torch import load_file

        super().__init__()
        stored = load_file(str(model_dir / "model.safetensors"))
        self.tensors = {n: stored[n] for n in sorted(stored) if drop is None or drop not in n}
        self.model_path = str(model_dir)

    def weight_specs(self) -> list[ParamSpec]:
        return [ParamSpec(n, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for n, t in self.tensors.items()]

    def hf_config(self) -> Any:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.model_path)


def publish(transport: Any, version: int, tmp_path: Path, served: dict, bucket_bytes: int | None = None) -> dict:
    """One update of ``version`` (``bucket_bytes``: the collective bucket size, else the default):
    the trainer's sequence here, the server's in another process; what the server saved."""
    import dataclasses
    import subprocess
    import threading

    meta = transport.plan(version)
    if bucket_bytes is not None:
        meta = dataclasses.replace(meta, bucket_bytes=bucket_bytes)
    parts = transport.prepare(meta)
    assert all(k.startswith("perf/") and v >= 0 for k, v in parts.items()), parts
    if not transport.sends_while_paused:
        transport.send(meta)
    server_meta, buckets = transport.server_update(meta)
    request = tmp_path / f"request-{version}.json"
    result = tmp_path / f"result-{version}.pt"
    request.write_text(
        json.dumps(
            {
                "mode": transport.name,
                "meta": server_meta.to_dict(),
                "buckets": None
                if buckets is None
                else [[[s.name, s.dtype, list(s.shape)] for s in b] for b in buckets],
                "served": served,
            }
        )
    )
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(request), str(result)])
    sender_error: list[BaseException] = []
    if transport.sends_while_paused:  # the servers receive while the trainer sends

        def send() -> None:
            try:
                transport.send(meta)
            except BaseException as exc:  # noqa: BLE001 - reported below
                sender_error.append(exc)

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        thread.join(timeout=120)
        assert not thread.is_alive(), "the trainer's send did not finish"
    assert server.wait(timeout=180) == 0, "the server process failed"
    assert not sender_error, sender_error
    transport.retire(meta)
    return torch.load(result, weights_only=False)


def served_specs(tensors: dict[str, torch.Tensor], *, reshape: str | None = None) -> dict[str, list]:
    """The served model as JSON: name -> [shape, dtype name]; ``reshape`` names one weight served
    with another shape (the update must be refused, naming it)."""
    served = {}
    for name, tensor in tensors.items():
        shape = list(tensor.shape)
        if name == reshape:
            shape = [tensor.numel() + 1]
        served[name] = [shape, str(published(tensor).dtype).removeprefix("torch.")]
    return served


def serve(request: dict[str, Any], out: Path) -> None:
    """A server's side of one update (see the module doc)."""
    from areal_tasks.api.weight_update import WeightUpdateMeta
    from areal_tasks.errors import WeightTransportError
    from areal_tasks.weights.base import ServedWeights, WeightLoad
    from areal_tasks.weights.registry import transport_class

    meta = WeightUpdateMeta.from_dict(request["meta"])
    buckets = request["buckets"]
    served = ServedWeights(
        {n: (tuple(shape), getattr(torch, dtype)) for n, (shape, dtype) in request["served"].items()},
        set(request["served"]),
    )
    receiver = transport_class(request["mode"]).receiver(torch.device("cpu"))
    try:
        receiver.open(meta, rank=1)
        got: dict[str, torch.Tensor] = {}
        for bucket in buckets if buckets is not None else [None]:
            specs = None if bucket is None else [ParamSpec(n, d, tuple(s)) for n, d, s in bucket]
            try:
                received = receiver.receive(WeightLoad.of(meta, specs), served)
            except WeightTransportError as exc:
                torch.save({"error": str(exc)}, out)
                return
            got.update({n: t.clone() for n, t in received.items()})
        try:
            receiver.finish_update()
        except WeightTransportError as exc:
            torch.save({"error": str(exc)}, out)
            return
        torch.save({"tensors": got}, out)
    finally:
        receiver.close()


if __name__ == "__main__":
    serve(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
