"""Temperature, top-k, top-p and min-p sampling without sorting the vocabulary.

SGLang's torch sampler (the reference, :func:`sorted_filter`) sorts every row of the
``[B, V]`` probabilities, takes their cumulative sum and masks the sorted ranks: at batch 256 and a
151,936-token vocabulary that segmented sort is most of a sampled step's device time. Every filter
it applies keeps an upward-closed set of the probabilities, so the kept set of a row is "every token
at least as likely as a threshold token" and only the threshold is needed:

* ``top-k`` keeps sorted rank ``j < k``: a token is in iff fewer than ``k`` tokens are above it;
* ``top-p`` keeps rank ``j`` iff the mass sorted before it is ``<= top_p``: the mass of the tokens
  above it (SGLang's rule, on the unfiltered probabilities);
* ``min-p`` keeps ``p >= min_p * p_max``.

:func:`draw_rows` finds the threshold by a search over the logits' **order keys** (the bits of a
float reinterpreted as an integer that orders like the float: :func:`order_keys`), so a fixed
number of rounds always ends on the exact threshold: 16-bit keys for bf16/fp16 logits, 32-bit ones
for fp32. Each round evaluates the predicate "fewer than ``k`` tokens and at most ``top_p`` of the
mass lie above ``t``" at ``fan_out - 1`` points of the row's current bracket (one pass over the
logits when compiled: a count and a masked sum per point) and keeps the sub-bracket where it turns
true; ``fan_out = 4`` takes 8 rounds for 16-bit keys. Tokens tied on the threshold value are
kept as a sort would keep them: as many as the rank and mass rules allow, the lowest indices first
(so ``top_k = 1`` is the argmax, first index on ties, as greedy decoding picks it). Min-p is then a
plain comparison with the row's maximum.

The kept tokens are drawn by inverse CDF over the vocabulary in index order (one cumulative sum and
a binary search per row) with one uniform number per row, given by the caller, as the sort path drew
them over sorted order: the same distribution (each kept token with probability proportional to
its own), not the same token for a given number. The sampled token's logprob is the one the server
reports, ``log_softmax(logits / temperature)`` at the token, before any filtering.

Nothing here reads a value back to the host, every shape is fixed by the inputs' shapes and every
loop has a fixed count, so the whole draw can be captured in a CUDA graph, eager or compiled
(``tests/gpu/test_sampling_gpu.py``; ``benchmarks/sampling_kernels.py`` times it against the sort
there). Compiled, each point of the search is a fused reduction; the two cumulative sums stay eager
(Inductor's scan codegen fails at this width in torch 2.11) and break the compiled graph in three.
Measured on an H200 at batch 256 x 151,936 inside a CUDA graph: 3.9 ms compiled against the sort's
4.6; eagerly the search's passes cost 12.7 ms, so an uncompiled picker on a GPU keeps the sort
(``greedy.py``).
"""

from __future__ import annotations

import torch

from areal_tasks.errors import InferenceError

#: points evaluated per search round plus one (the bracket is cut into this many parts).
FAN_OUT = 4

_KEY_BITS = {torch.bfloat16: 16, torch.float16: 16, torch.float32: 32}


def order_keys(logits: torch.Tensor) -> torch.Tensor:
    """int32 keys of ``logits`` (bf16, fp16 or fp32) that order exactly as the values do.

    A float's bits read as a signed integer order the non-negative values; flipping the magnitude
    bits of the negative ones makes the whole line ordered (``-0.0`` lands just below ``+0.0``)."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        bits = logits.view(torch.int16).to(torch.int32)
        return bits ^ ((bits >> 15) & 0x7FFF)
    if logits.dtype == torch.float32:
        bits = logits.view(torch.int32)
        return bits ^ ((bits >> 31) & 0x7FFFFFFF)
    raise InferenceError(f"order_keys takes bf16, fp16 or fp32 logits, got {logits.dtype}; cast them first")


def search_rounds(key_bits: int, fan_out: int = FAN_OUT) -> int:
    """Rounds that narrow a bracket of ``2**key_bits`` integers (``(min - 1, max]``) to one step,
    cutting it into ``fan_out`` parts a round."""
    if fan_out < 2:
        raise InferenceError(f"fan_out must be at least 2, got {fan_out}")
    width, rounds = 2**key_bits, 0
    while width > 1:
        width = -(-width // fan_out)
        rounds += 1
    return rounds


def _above(
    keys: torch.Tensor, probs: torch.Tensor, threshold: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask of the tokens above ``threshold`` [B, 1], their count [B], their mass [B])."""
    above = keys > threshold
    return above, above.sum(dim=-1), torch.where(above, probs, 0.0).sum(dim=-1)


def _rank_mass_ok(count: torch.Tensor, mass: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Whether a token with ``count`` tokens and ``mass`` above it passes top-k and top-p."""
    return (count < top_ks) & ((top_ps >= 1.0) | (mass <= top_ps))


def threshold_keys(
    keys: torch.Tensor,
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    rounds: int,
    fan_out: int = FAN_OUT,
) -> torch.Tensor:
    """The smallest key ``v`` per row [B] (int64) such that fewer than ``top_ks`` tokens and at most
    ``top_ps`` of the mass lie strictly above it: the kept set (ties aside) is ``keys >= v``.

    The bracket ``(lo, hi]`` starts at (row minimum - 1, row maximum), where the predicate holds at
    ``hi``; each round cuts it into ``fan_out`` parts and keeps the one where the predicate turns
    true. ``rounds`` must cover the keys' width (:func:`search_rounds`)."""
    lo = keys.amin(dim=-1).long() - 1
    hi = keys.amax(dim=-1).long()
    for _ in range(rounds):
        width = hi - lo
        new_lo, new_hi = lo, hi
        for j in range(1, fan_out):
            point = lo + (width * j) // fan_out
            _, count, mass = _above(keys, probs, point.view(-1, 1))
            ok = _rank_mass_ok(count, mass, top_ks, top_ps)
            new_lo = torch.where(ok, new_lo, torch.maximum(new_lo, point))
            new_hi = torch.where(ok, torch.minimum(new_hi, point), new_hi)
        lo, hi = new_lo, new_hi
    return hi


@torch.compiler.disable
def _tie_ranks(tied: torch.Tensor) -> torch.Tensor:
    """1-based rank of each tied token among its row's ties, in index order (an eager scan: see
    :func:`inverse_cdf`)."""
    return tied.to(torch.int32).cumsum(dim=-1, dtype=torch.int32)


def kept_mask(
    keys: torch.Tensor,
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    rounds: int,
    fan_out: int = FAN_OUT,
) -> torch.Tensor:
    """[B, V] bool: the tokens SGLang's sorted top-k / top-p / min-p filter keeps (ties on the
    threshold value: as many as its rank and mass rules allow, lowest indices first)."""
    boundary = threshold_keys(keys, probs, top_ks, top_ps, rounds, fan_out).view(-1, 1)
    above, count, mass = _above(keys, probs, boundary)
    tied = keys == boundary
    ties = tied.sum(dim=-1)
    tie_prob = torch.where(tied, probs, 0.0).amax(dim=-1)
    # sorted, the ties sit at ranks count.. count+ties-1 with mass + j * tie_prob before the j-th
    room = ((top_ps - mass) / tie_prob.clamp(min=torch.finfo(torch.float32).tiny)).clamp(min=0.0)
    by_mass = torch.where(top_ps >= 1.0, ties.double(), torch.floor(room.double().clamp(max=ties.double())) + 1)
    keep_ties = torch.minimum(torch.minimum(ties, top_ks - count), by_mass.long())
    tie_rank = _tie_ranks(tied)
    kept = above | (tied & (tie_rank <= keep_ties.view(-1, 1)))
    top = probs.amax(dim=-1, keepdim=True)
    return kept & (probs >= top * min_ps.view(-1, 1))


@torch.compiler.disable
def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One index per row [B] drawn with probability proportional to ``weights`` [B, V] (>= 0, a
    positive entry per row) from ``uniforms`` [B] in [0, 1), by a cumulative sum in index order.

    Never compiled (nor :func:`_tie_ranks`): Inductor's split scan over a 151,936-wide row fails to
    generate its Triton kernel in torch 2.11, and the eager scan is one kernel anyway."""
    cdf = torch.cumsum(weights, dim=-1)
    total = cdf[:, -1]
    # strictly below the total, so the search lands inside the CDF
    targets = torch.minimum(uniforms * total, torch.nextafter(total, torch.zeros_like(total)))
    picks = torch.searchsorted(cdf, targets.view(-1, 1), right=True).clamp_(max=weights.shape[-1] - 1)
    # a pick lands on a zero weight only through the scan's float rounding (a parallel cumsum may
    # step up where a weight is 0): it then takes the row's heaviest token, without a sync
    picks = torch.where(weights.gather(1, picks) > 0, picks, weights.argmax(dim=-1, keepdim=True))
    return picks.view(-1)


def draw_rows(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
    filtered: bool = True,
    fan_out: int = FAN_OUT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [B, V] (bf16, fp16 or fp32); returns (token ids [B]
    int64, logprobs [B] float32). Per-row settings are [B] tensors on the logits' device:
    ``temperatures`` (1 for greedy rows), ``top_ks`` (int64; ``>= V`` for none), ``top_ps``,
    ``min_ps``, ``greedy`` (bool: take the argmax) and ``uniforms`` in [0, 1). ``filtered=False``
    skips the threshold search (no row filters). No host sync, fixed shapes and loop counts."""
    scaled = logits.float() / temperatures.view(-1, 1)
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    probs = torch.exp(scaled - lse)
    if filtered:
        keys = order_keys(logits if logits.dtype in _KEY_BITS else logits.float())
        rounds = search_rounds(_KEY_BITS.get(logits.dtype, 32), fan_out)
        weights = torch.where(kept_mask(keys, probs, top_ks, top_ps, min_ps, rounds, fan_out), probs, 0.0)
    else:
        weights = probs
    tokens = torch.where(greedy, torch.argmax(scaled, dim=-1), inverse_cdf(weights, uniforms))
    logprobs = (scaled.gather(1, tokens.view(-1, 1)) - lse).view(-1)
    return tokens, logprobs


def sorted_filter(
    probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's sorted filter (the server's sampler before the sort-free search): sorted
    probabilities [B, V] with top-k / top-p / min-p zeroed, and their token ids. The reference the
    tests and ``benchmarks/sampling_kernels.py`` compare :func:`kept_mask` with, and the filter of
    :func:`sorted_draw`."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    ranks = torch.arange(probs.shape[-1], device=probs.device).view(1, -1)
    probs_sort.masked_fill_(ranks >= top_ks.view(-1, 1), 0.0)
    probs_sort.masked_fill_((probs_sum - probs_sort) > top_ps.view(-1, 1), 0.0)
    min_p_thresholds = probs_sort[:, :1] * min_ps.view(-1, 1)
    probs_sort.masked_fill_(probs_sort < min_p_thresholds, 0.0)
    return probs_sort, probs_idx


def sorted_draw(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    greedy: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`draw_rows` through :func:`sorted_filter` (inverse CDF over sorted order), as the server
    drew before the search. Still the draw of an uncompiled picker on a GPU: there one sort (4.6 ms
    at batch 256 x 151,936 on an H200) beats the search's eager passes (12.7 ms at fan-out 2), while
    compiled the search wins (3.9 ms; docs/benchmarks.md, "Sampling without a sort"). Also the
    baseline of the tests and the benchmark."""
    scaled = logits.float() / temperatures.view(-1, 1)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    weights, ids = sorted_filter(logprobs_all.exp(), top_ks, top_ps, min_ps)
    chosen = ids.gather(1, inverse_cdf(weights, uniforms).view(-1, 1)).view(-1)
    tokens = torch.where(greedy, torch.argmax(scaled, dim=-1), chosen)
    return tokens, logprobs_all.gather(1, tokens.view(-1, 1)).view(-1)
