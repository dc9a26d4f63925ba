"""The wire type that names one weight update from the trainer to the inference servers.

A :class:`WeightUpdateMeta` says which policy version is being published and how the weights travel:

* ``disk``: the trainer writes sharded HF safetensors under ``path`` (atomically) and every server
  loads them from there (SGLang ``/update_weights_from_disk``);
* ``collective``: trainer rank 0 and all inference server ranks join one process group (rendezvous at
  ``master_addr:master_port``, ``world_size`` members, trainer = rank 0) named ``group_name``; rank 0
  broadcasts the weights in buckets of at most ``bucket_bytes`` (SGLang
  ``/init_weights_update_group`` + ``/update_weights_from_distributed``);
* ``shared``: trainer and servers on one host (colocated): every trainer rank packs the weights
  into a buffer it keeps for the run (on its GPU, opened by the servers through CUDA IPC; on CPU a
  shared-memory file) and a server copies from the buffer on its own device. ``shared_buffers``
  describes them (:mod:`areal_tasks.weights.shared_buffer`); the trainer fills it in once the
  buffers exist, so a record without it is valid only on the trainer's side.

The same type is built by the trainer and consumed by the inference side, so it is torch-free and
round-trips through :meth:`to_dict` / :meth:`from_dict` (JSON-safe).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from areal_tasks.errors import ConfigError

logger = logging.getLogger(__name__)

WEIGHT_UPDATE_WIRE_VERSION = 1

UpdateType = Literal["disk", "collective", "shared"]
CollectiveBackend = Literal["gloo", "nccl"]

_DEFAULT_BUCKET_BYTES = 1024 * 1024 * 1024  # a 0.5B model in bf16 is one bucket: one HTTP round trip


@dataclass(frozen=True)
class WeightUpdateMeta:
    """One published weight update: its version and how the weights travel."""

    #: ``disk``, ``collective`` or ``shared``.
    type: UpdateType
    #: the policy version the new weights carry (the trainer's version after the step).
    version: int
    #: disk: directory the sharded safetensors are written to (a local/NFS path).
    path: str | None = None
    #: collective: rendezvous host of the weight-update group.
    master_addr: str | None = None
    #: collective: rendezvous port of the weight-update group.
    master_port: int | None = None
    #: collective: members of the group (1 trainer rank + all inference server ranks).
    world_size: int | None = None
    #: collective: name of the group (a key prefix in the rendezvous store).
    group_name: str = "areal_weight_update"
    #: collective: ``gloo`` (CPU) or ``nccl`` (GPU).
    backend: CollectiveBackend = "gloo"
    #: collective: maximum bytes per broadcast bucket.
    bucket_bytes: int = _DEFAULT_BUCKET_BYTES
    #: seconds a member waits for the others (rendezvous and each collective).
    timeout_s: float = 300.0
    #: shared: one JSON description per trainer rank's buffer (``weights/shared_buffer.py``).
    shared_buffers: tuple[dict[str, Any], ...] = ()
    #: format version of this record.
    wire_version: int = WEIGHT_UPDATE_WIRE_VERSION

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError("invalid WeightUpdateMeta: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every invalid field, as ``"<field>: <what is wrong>"``."""
        found: list[str] = []
        if self.type not in ("disk", "collective", "shared"):
            found.append(f"type: must be 'disk', 'collective' or 'shared', got {self.type!r}")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 0:
            found.append(f"version: must be an integer >= 0, got {self.version!r}")
        if self.type == "disk" and not self.path:
            found.append("path: a disk update needs the directory to write/read, got None")
        if self.type == "collective":
            if not self.master_addr:
                found.append("master_addr: a collective update needs the rendezvous host")
            port = self.master_port
            if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
                found.append(f"master_port: must be an integer in 1..65535, got {port!r}")
            size = self.world_size
            if not isinstance(size, int) or isinstance(size, bool) or size < 2:
                found.append(f"world_size: must be an integer >= 2 (trainer + servers), got {size!r}")
            if self.backend not in ("gloo", "nccl"):
                found.append(f"backend: must be 'gloo' or 'nccl', got {self.backend!r}")
            if not self.group_name:
                found.append("group_name: must not be empty")
        if not isinstance(self.shared_buffers, tuple) or not all(
            isinstance(b, dict) and isinstance(b.get("kind"), str) for b in self.shared_buffers
        ):
            found.append(f"shared_buffers: must be a tuple of dicts, each with a 'kind', got {self.shared_buffers!r}")
        elif self.shared_buffers and self.type != "shared":
            found.append(f"shared_buffers: only a shared update names buffers, this one is {self.type!r}")
        if not isinstance(self.bucket_bytes, int) or self.bucket_bytes < 1:
            found.append(f"bucket_bytes: must be an integer >= 1, got {self.bucket_bytes!r}")
        if not self.timeout_s > 0:
            found.append(f"timeout_s: must be > 0, got {self.timeout_s!r}")
        if self.wire_version != WEIGHT_UPDATE_WIRE_VERSION:
            found.append(
                f"wire_version: this build speaks version {WEIGHT_UPDATE_WIRE_VERSION}, got {self.wire_version!r}"
            )
        return found

    @classmethod
    def disk(cls, path: str, version: int) -> WeightUpdateMeta:
        """A disk update of ``version`` written under ``path``."""
        return cls(type="disk", version=version, path=path)

    @classmethod
    def collective(
        cls,
        version: int,
        master_addr: str,
        master_port: int,
        world_size: int,
        *,
        group_name: str = "areal_weight_update",
        backend: CollectiveBackend = "gloo",
        bucket_bytes: int = _DEFAULT_BUCKET_BYTES,
        timeout_s: float = 300.0,
    ) -> WeightUpdateMeta:
        """A collective update of ``version`` over the group rendezvousing at ``master_addr:master_port``."""
        return cls(
            type="collective",
            version=version,
            master_addr=master_addr,
            master_port=master_port,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
            bucket_bytes=bucket_bytes,
            timeout_s=timeout_s,
        )

    @classmethod
    def shared(cls, version: int, shared_buffers: tuple[dict[str, Any], ...] = ()) -> WeightUpdateMeta:
        """A shared-memory update of ``version`` (``shared_buffers``: see :meth:`with_buffers`)."""
        return cls(type="shared", version=version, shared_buffers=tuple(shared_buffers))

    def with_buffers(self, shared_buffers: tuple[dict[str, Any], ...]) -> WeightUpdateMeta:
        """This shared update, naming the trainer's buffers (what the servers need to read them)."""
        if self.type != "shared":
            raise ConfigError(f"with_buffers: only a shared update names buffers, this one is {self.type!r}")
        return replace(self, shared_buffers=tuple(shared_buffers))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (the HTTP/RPC wire form)."""
        data = asdict(self)
        data["shared_buffers"] = [dict(b) for b in self.shared_buffers]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WeightUpdateMeta:
        """Rebuild from :meth:`to_dict` output; unknown keys are an error (a newer sender)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"WeightUpdateMeta.from_dict: unknown keys {unknown}; known keys are {sorted(known)}")
        data = dict(data)
        if isinstance(data.get("shared_buffers"), list):
            data["shared_buffers"] = tuple(data["shared_buffers"])
        return cls(**data)
