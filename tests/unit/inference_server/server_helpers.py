"""Helpers of the embedded-server unit tests: build, submit and await engine requests; the target
distribution of SGLang's sampler and a chi-square test against it."""

from __future__ import annotations

import concurrent.futures
import math
from dataclasses import dataclass, replace

import torch

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
        seqs.append(
            Sequence(
                rid=rid if n == 1 else f"{rid}_{j}",
                group=group,
                params=replace(p, sampling_seed=seed),
                on_finish=lambda s, f=fut: f.set_result(s),
                return_logprob=return_logprob,
            )
        )
        futures.append(fut)
    return Submitted(seqs, futures)


def generate(engine: Engine, prompt: list[int], **params) -> Sequence:
    """Run one request (n = 1) alone and return its finished sequence."""
    req = make_request(prompt, **params)
    engine.submit(req.seqs)
    return req.wait()[0]


def expected_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """SGLang's sampling distribution, computed independently in float64 with plain loops."""
    probs = torch.softmax(logits.double() / p.temperature, -1)
    order = sorted(range(len(probs)), key=lambda i: -probs[i].item())
    keep, cumulative = torch.zeros_like(probs), 0.0
    top = probs[order[0]].item()
    for rank, idx in enumerate(order):
        prob = probs[idx].item()
        in_k = p.top_k < 0 or rank < p.top_k
        in_p = cumulative <= p.top_p
        in_min_p = prob >= p.min_p * top
        if in_k and in_p and in_min_p:
            keep[idx] = prob
        cumulative += prob
    return keep / keep.sum()


def chi_square_critical(dof: int, z: float = 4.753) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 4.753: p = 1e-6)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def chi_square(counts: torch.Tensor, expected: torch.Tensor, total: int) -> tuple[float, int]:
    """Chi-square over the tokens with expected count >= 5 plus one pooled bin for the rest."""
    exp_counts = expected * total
    big = exp_counts >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().view(1)])
    exp = torch.cat([exp_counts[big], exp_counts[~big].sum().view(1)])
    if exp[-1] < 5:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, len(obs) - 1
