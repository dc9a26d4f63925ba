"""Helpers of the embedded-server unit tests: build, submit and await engine requests."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, replace

from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.request import Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams


@dataclass
class Submitted:
    """The sequences of one request and the futures their ``on_finish`` resolves."""

    seqs: list[Sequence]
    futures: list[concurrent.futures.Future]

    def wait(self, timeout: float = 120.0) -> list[Sequence]:
        return [f.result(timeout=timeout) for f in self.futures]


def make_request(prompt: list[int], rid: str = "r", n: int = 1, return_logprob: bool = True, **params) -> Submitted:
    """The ``n`` sequences of one request (not yet submitted)."""
    p = SamplingParams(**{"n": n, **params})
    group = SequenceGroup(prompt_ids=list(prompt))
    seqs, futures = [], []
    for j in range(n):
        fut: concurrent.futures.Future = concurrent.futures.Future()
        seed = None if p.sampling_seed is None else p.sampling_seed + j
        seqs.append(Sequence(rid=rid if n == 1 else f"{rid}_{j}", group=group, params=replace(p, sampling_seed=seed),
                             on_finish=lambda s, f=fut: f.set_result(s), return_logprob=return_logprob))
        futures.append(fut)
    return Submitted(seqs, futures)


def generate(engine: Engine, prompt: list[int], **params) -> Sequence:
    """Run one request (n = 1) alone and return its finished sequence."""
    req = make_request(prompt, **params)
    engine.submit(req.seqs)
    return req.wait()[0]
