"""The Triton source of the sampled step's draw (``sampling_triton.py`` launches it and documents
the method). Imports Triton at module level: import this module only where
:func:`~.sampling_triton.kernel_available` is True."""

import triton
import triton.language as tl


@triton.jit
def order_key(x, KEY_BITS: tl.constexpr):
    """int32 keys that order as the float values do (see sampling_kernels.order_keys)."""
    if KEY_BITS == 16:
        bits = x.to(tl.int16, bitcast=True).to(tl.int32)
        return bits ^ ((bits >> 15) & 0x7FFF)
    else:
        bits = x.to(tl.int32, bitcast=True)
        return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def key_value(key, logits_ptr, KEY_BITS: tl.constexpr):
    """The float value (fp32) of an order key (the key transform is its own inverse)."""
    if KEY_BITS == 16:  # noqa: SIM108 (a compile-time branch of the kernel: no conditional expression in Triton)
        bits = (key ^ ((key >> 15) & 0x7FFF)).to(tl.int16)
    else:
        bits = (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.int32)
    return bits.to(logits_ptr.dtype.element_ty, bitcast=True).to(tl.float32)


@triton.jit
def sample_rows_kernel(
    logits_ptr,
    row_stride,
    vocab,
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    greedy_ptr,
    seed_ptr,
    tokens_ptr,
    logprobs_ptr,
    FILTERED: tl.constexpr,
    KEY_BITS: tl.constexpr,
    TOP_K_ROWS: tl.constexpr,
    TOP_P_ROWS: tl.constexpr,
    FAN: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SEARCH_BLOCK: tl.constexpr,
):
    """One program per row; every loop keeps per-lane accumulators and reduces them once after it
    (a reduction across the program's warps inside the loop would cost a barrier per block)."""
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    span = tl.arange(0, BLOCK_V)
    temperature = tl.load(temperature_ptr + row)

    # pass 1: log-sum-exp, argmax (first index), key range; per lane, then across lanes
    lane_best = tl.full([BLOCK_V], -3.0e38, tl.float32)
    lane_total = tl.zeros([BLOCK_V], tl.float32)
    lane_arg = tl.zeros([BLOCK_V], tl.int32)
    lane_key_lo = tl.full([BLOCK_V], 2147483647, tl.int32)
    lane_key_hi = tl.full([BLOCK_V], -2147483647 - 1, tl.int32)
    for start in range(0, vocab, BLOCK_V):
        index = start + span
        inside = index < vocab
        x = tl.load(base + index, mask=inside, other=float("-inf"))
        scaled = x.to(tl.float32) / temperature
        new_best = tl.maximum(lane_best, scaled)
        lane_total = lane_total * tl.exp(lane_best - new_best) + tl.exp(scaled - new_best)
        lane_arg = tl.where(scaled > lane_best, index, lane_arg)
        lane_best = new_best
        key = order_key(x, KEY_BITS)
        lane_key_lo = tl.minimum(lane_key_lo, tl.where(inside, key, 2147483647))
        lane_key_hi = tl.maximum(lane_key_hi, tl.where(inside, key, -2147483647 - 1))
    best = tl.max(lane_best, 0)
    lse = best + tl.log(tl.sum(lane_total * tl.exp(lane_best - best), 0))
    pick = tl.min(tl.where(lane_best == best, lane_arg, 2147483647), 0)
    key_lo = tl.min(lane_key_lo, 0)
    key_hi = tl.max(lane_key_hi, 0)

    if tl.load(greedy_ptr + row) == 0:
        top_k = tl.load(top_k_ptr + row)
        top_p = tl.load(top_p_ptr + row)
        mass_cap = tl.where(top_p >= 1.0, float("inf"), top_p)  # no top-p: any mass passes
        # the bracket (lo, hi] of the threshold key; counts of tokens strictly above its ends
        lo = key_lo.to(tl.int64) - 1
        hi = lo
        above_lo = vocab.to(tl.int64)
        above_hi = vocab.to(tl.int64)
        mass_hi = 1.0
        if FILTERED:  # noqa: SIM102 (compile-time, then a runtime test: Triton cannot `and` them)
            if (top_k < vocab).to(tl.int32) + (top_p < 1.0).to(tl.int32) > 0:
                hi = key_hi.to(tl.int64)
                above_hi = above_hi * 0
                mass_hi = 0.0
                j = tl.arange(0, FAN) + 1  # the last point is hi itself, where the predicate holds
                lanes = tl.arange(0, SEARCH_BLOCK)
                while hi - lo > 1:  # a round cuts the bracket FAN-fold: 3 or 4 rounds for bf16 keys
                    points = lo + ((hi - lo) * j) // FAN
                    points32 = points.to(tl.int32)
                    lane_count = tl.zeros([FAN, SEARCH_BLOCK], dtype=tl.int32)
                    lane_mass = tl.zeros([FAN, SEARCH_BLOCK], dtype=tl.float32)
                    for start in range(0, vocab, SEARCH_BLOCK):
                        index = start + lanes
                        inside = index < vocab
                        x = tl.load(base + index, mask=inside, other=float("-inf"))
                        key = tl.where(inside, order_key(x, KEY_BITS), -2147483647 - 1)
                        above = key[None, :] > points32[:, None]
                        if TOP_K_ROWS:  # counts only where a row of the batch filters by top-k
                            lane_count += above.to(tl.int32)
                        if TOP_P_ROWS:  # masses only where one filters by top-p
                            prob = tl.exp(x.to(tl.float32) / temperature - lse)
                            lane_mass += tl.where(above, prob[None, :], 0.0)
                    count = tl.sum(lane_count, 1)
                    mass = tl.sum(lane_mass, 1)
                    ok = (count < top_k) & (mass <= mass_cap)
                    first = tl.min(tl.where(ok, j, FAN + 1), 0)
                    at_first = j == first
                    before_first = j == first - 1
                    moved = first > 1
                    new_lo = tl.where(moved, tl.sum(tl.where(before_first, points, 0), 0), lo)
                    above_lo = tl.where(moved, tl.sum(tl.where(before_first, count, 0), 0).to(tl.int64), above_lo)
                    hi = tl.sum(tl.where(at_first, points, 0), 0)
                    above_hi = tl.sum(tl.where(at_first, count, 0), 0).to(tl.int64)
                    mass_hi = tl.sum(tl.where(at_first, mass, 0.0), 0)
                    lo = new_lo
        # tokens tied on the threshold: as many as the rank and mass rules allow, lowest first
        ties = above_lo - above_hi
        tie_prob = tl.exp(key_value(hi, logits_ptr, KEY_BITS) / temperature - lse)
        room = tl.maximum((top_p - mass_hi) / tl.maximum(tie_prob, 1.1754944e-38), 0.0)
        by_mass = tl.where(top_p >= 1.0, ties, tl.minimum(room, ties.to(tl.float32)).to(tl.int64) + 1)
        keep_ties = tl.minimum(tl.minimum(ties, top_k - above_hi), by_mass)
        threshold = tl.maximum(hi, -2147483647 - 1).to(tl.int32)
        # the index of the last tied token kept (every tie: past the row; none: -1)
        cut = vocab - 1
        if keep_ties < ties:
            cut = -1
            seen = 0
            start = 0
            while (seen < keep_ties) & (start < vocab):
                index = start + span
                inside = index < vocab
                key = order_key(tl.load(base + index, mask=inside, other=float("-inf")), KEY_BITS)
                tied = ((key == threshold) & inside).to(tl.int32)
                rank = seen + tl.cumsum(tied, 0)
                cut = tl.maximum(cut, tl.max(tl.where((tied > 0) & (rank == keep_ties), index, -1), 0))
                seen += tl.sum(tied, 0)
                start += BLOCK_V
        min_prob = tl.load(min_p_ptr + row) * tl.exp(best - lse)
        seed = tl.load(seed_ptr + row)

        # pass 3: the exponential race among the kept tokens, per lane, then across lanes
        lane_score = tl.full([BLOCK_V], float("-inf"), tl.float32)
        lane_pick = tl.zeros([BLOCK_V], tl.int32)
        for start in range(0, vocab, BLOCK_V):
            index = start + span
            inside = index < vocab
            x = tl.load(base + index, mask=inside, other=float("-inf"))
            scaled = x.to(tl.float32) / temperature
            key = order_key(x, KEY_BITS)
            kept = (key > threshold) | ((key == threshold) & (index <= cut))
            kept = kept & inside & (tl.exp(scaled - lse) >= min_prob)
            u = tl.rand(seed, index)
            race = tl.where(u < 1.0e-4, u + 0.5 * u * u, -tl.log(1.0 - u))
            race = tl.maximum(race, 2.3283064e-10)  # u == 0: half the generator's smallest step
            score = tl.where(kept, scaled - tl.log(race), float("-inf"))
            lane_pick = tl.where(score > lane_score, index, lane_pick)
            lane_score = tl.maximum(lane_score, score)
        winner = tl.max(lane_score, 0)
        pick = tl.where(winner > float("-inf"), tl.min(tl.where(lane_score == winner, lane_pick, 2147483647), 0), pick)

    chosen = tl.load(base + pick).to(tl.float32) / temperature
    tl.store(tokens_ptr + row, pick.to(tl.int64))
    tl.store(logprobs_ptr + row, chosen - lse)
