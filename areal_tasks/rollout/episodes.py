"""Episode identity: which sample of which prompt an episode is, its per-sample seeds, and the per-step log.

An episode is sample ``j`` of the group of the dataset item at ``index`` in data epoch ``epoch``:
:class:`EpisodeId`. The executor stamps it on every trajectory (``metadata["episode"]``, with the
servers that answered and the resubmissions), and the RL loop appends each step's identities to
``<run_dir>/rollout_episodes.jsonl`` (:func:`append_episode_log`), so a run can be checked for an
episode lost or trained twice, across a server's death or a job's retry.

With ``rollout.sampling.seed_mode: per_sample`` every generation request of an episode gets its own
seed, :func:`episode_seed` of (the base seed, epoch, index, j, turn): the samples do not depend on
which other requests shared a server batch, which server answered or in what order episodes
finished, so two runs of one config draw the same tokens (given batch-invariant decoding; see
``docs/rollout.md``). :class:`EpisodeEngine` is the engine an episode's workflow sees: it sets those
seeds and records the answering servers and each generate call's facts (:func:`call_record`: times,
lengths, first and last token versions, resubmissions, stop reason; what the session trace writes,
``areal_tasks/trace/sessions.py``); everything else passes through to the shared engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from areal_tasks.api.inference import InferenceEngine, ModelRequest, ModelResponse
    from areal_tasks.api.workflow import Trajectory

__all__ = [
    "EPISODE_KEY",
    "EpisodeEngine",
    "EpisodeId",
    "append_episode_log",
    "call_record",
    "episode_record",
    "episode_seed",
]

#: the trajectory metadata key holding the episode's identity and servers.
EPISODE_KEY = "episode"
_SEED_BITS = 63


@dataclass(frozen=True, order=True)
class EpisodeId:
    """Sample ``sample`` of the dataset item ``index`` as visited in data epoch ``epoch``."""

    epoch: int
    index: int
    sample: int

    def as_list(self) -> list[int]:
        return [self.epoch, self.index, self.sample]


def episode_seed(base: int, episode: EpisodeId, turn: int) -> int:
    """A 63-bit seed for generation request ``turn`` of ``episode`` (a hash, so nearby ids do not
    give correlated streams)."""
    text = f"{base}/{episode.epoch}/{episode.index}/{episode.sample}/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> (64 - _SEED_BITS)


@dataclass
class EpisodeEngine:
    """The engine one episode's workflow uses: seeds its requests (``seed_base`` set) and records
    the servers that answered and one :func:`call_record` per generate call (the session trace's
    ``calls``); any other attribute is the shared engine's."""

    inner: InferenceEngine
    episode: EpisodeId
    seed_base: int | None = None
    servers: list[str] = field(default_factory=list)
    resubmits: int = 0
    turns: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        if self.seed_base is not None:
            seed = episode_seed(self.seed_base, self.episode, self.turns)
            req = dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, seed=seed))
        self.turns += 1
        started = time.time()
        try:
            response = await self.inner.agenerate(req)
        except BaseException as exc:
            ended = "cancelled" if isinstance(exc, asyncio.CancelledError) else f"error: {type(exc).__name__}"
            version = _version_of(self.inner)
            self.calls.append(call_record(started, len(req.input_ids), 0, version, version, 0, ended))
            raise
        versions = response.output_versions
        if versions:
            first, last = versions[0], versions[-1]
        else:
            first = last = _version_of(self.inner)
        self.calls.append(
            call_record(
                started,
                len(req.input_ids),
                response.output_len,
                first,
                last,
                response.n_resubmits,
                str(response.stop_reason),
            )
        )
        self.servers.append(response.server)
        self.resubmits += response.n_resubmits
        return response

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def record(self) -> dict[str, Any]:
        """What goes into ``metadata["episode"]``."""
        return {"id": self.episode.as_list(), "servers": list(self.servers), "resubmits": self.resubmits}


def call_record(
    t0: float, in_tokens: int, out_tokens: int, version_start: int, version_end: int, aborted: int, stop_reason: str
) -> dict[str, Any]:
    """One generate call of an episode as the session trace records it (``t1`` is now)."""
    return {
        "t0": t0,
        "t1": time.time(),
        "in_tokens": in_tokens,
        "out_tokens": out_tokens,
        "version_start": version_start,
        "version_end": version_end,
        "aborted": aborted,
        "stop_reason": stop_reason,
    }


def _version_of(engine: InferenceEngine) -> int:
    """The engine's current version (a call that produced no token has no token versions)."""
    return int(engine.get_version())


def episode_record(traj: Trajectory) -> dict[str, Any] | None:
    """The episode facts of a trajectory made by the executor (None for one made elsewhere)."""
    metadata = getattr(traj, "metadata", None)
    value = metadata.get(EPISODE_KEY) if isinstance(metadata, dict) else None
    return value if isinstance(value, dict) else None


def append_episode_log(path: str | os.PathLike[str], step: int, batch: Sequence[Trajectory]) -> None:
    """Append one JSON line for training step ``step``: the batch's episode ids in batch order, the
    servers that answered each and its resubmissions."""
    records = [episode_record(t) or {} for t in batch]
    line = {
        "step": step,
        "episodes": [r.get("id") for r in records],
        "servers": [r.get("servers", []) for r in records],
        "resubmits": [r.get("resubmits", 0) for r in records],
    }
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
