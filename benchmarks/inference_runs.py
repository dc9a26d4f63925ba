"""In-process engine runs of the inference throughput benchmark (``inference_throughput.py``): every
prompt submitted at once to an :class:`~areal_tasks.inference.server.engine.Engine`, timed until
the last answer, and the fastest of several runs with its decode anatomy.
"""

from __future__ import annotations

import time

import torch


def run_engine(
    engine, prompts: list[list[int]], new_tokens: int, sampling: dict, n: int = 1
) -> tuple[float, list[list[int]]]:
    """Submit every prompt at once, ``n`` samples of each sharing one prefill (one
    ``SequenceGroup`` a prompt, as the server builds for an ``n``-sample request); returns
    (seconds until the last answer, outputs, prompt-major). Raises InferenceError when a sequence
    ends short of ``new_tokens`` (EOS is ignored, so only an abort or the context ends one)."""
    import concurrent.futures

    from areal_tasks.errors import InferenceError
    from areal_tasks.inference.server.request import Sequence, SequenceGroup
    from areal_tasks.inference.server.sampling import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True, n=n, **sampling)
    futures, seqs = [], []
    for i, prompt in enumerate(prompts):
        group = SequenceGroup(list(prompt))
        for j in range(n):
            fut: concurrent.futures.Future = concurrent.futures.Future()
            seqs.append(
                Sequence(
                    rid=f"b{i}" if n == 1 else f"b{i}_{j}",
                    group=group,
                    params=params,
                    on_finish=lambda s, f=fut: f.set_result(s),
                )
            )
            futures.append(fut)
    start = time.perf_counter()
    engine.submit(seqs)
    done = [f.result(timeout=3600) for f in futures]
    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if short := [s for s in done if len(s.output_ids) != new_tokens]:
        raise InferenceError(
            f"{len(short)} of {len(done)} sequences ended with {len(short[0].output_ids)} of {new_tokens} tokens "
            f"({short[0].finish_reason}); the context must hold --prompt-len + --new-tokens"
        )
    return seconds, [s.output_ids for s in done]


def warm_up(engine, prompts: list[list[int]], sampling: dict | None = None, n: int = 1) -> None:
    """Every prompt for a few tokens (greedy unless ``sampling`` says otherwise): the timed runs
    then meet admission prefills and sampling batches of shapes the engine has run before, as a
    serving engine does after its first requests. A new shape's first-call cost (per-shape kernel
    selection) is measured on its own in ``step_parts``."""
    run_engine(engine, prompts, 4, sampling or {"temperature": 0.0}, n)


#: the engine counters a run's anatomy is the difference of (``EngineStats`` fields; ``/metrics``
#: exposes each as ``sglang:<name>`` or ``areal:<name>``).
ANATOMY_COUNTERS = (
    "decode_steps_total",
    "decode_seconds_total",
    "decode_wait_seconds_total",
    "prefill_batches_total",
    "prefill_seconds_total",
    "prompt_tokens_total",
    "cached_tokens_total",
)


def counters_of(stats) -> dict[str, float]:
    """The engine's counters from an ``EngineStats`` snapshot, keyed as :func:`decode_anatomy` reads them."""
    return {key: float(getattr(stats, key)) for key in ANATOMY_COUNTERS}


def decode_anatomy(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
    """What the engine did over a run of ``seconds``, from its counters before and after: decode
    steps, host milliseconds a step and the part of them the host waited for the device (near the
    whole step: device-bound; near zero: host-bound), admission prefills and their host time, the
    rest of the wall time (the engine idle or waiting for requests: over HTTP, the requests'
    arrival and the answers' departure), and the prompt tokens prefilled and those whose KV was
    reused (``n > 1`` siblings, prefix hits)."""
    delta = {key: after[key] - before[key] for key in ANATOMY_COUNTERS}
    steps = int(delta["decode_steps_total"])
    decode_s, prefill_s = delta["decode_seconds_total"], delta["prefill_seconds_total"]
    return {
        "decode_steps": steps,
        "ms_per_step": 1e3 * decode_s / max(steps, 1),
        "wait_ms_per_step": 1e3 * delta["decode_wait_seconds_total"] / max(steps, 1),
        "decode_s": decode_s,
        "prefills": int(delta["prefill_batches_total"]),
        "prefill_s": prefill_s,
        "other_s": max(seconds - decode_s - prefill_s, 0.0),
        "prefilled_tokens": int(delta["prompt_tokens_total"]),
        "reused_prompt_tokens": int(delta["cached_tokens_total"]),
    }


def timed_engine_run(
    engine, prompts: list[list[int]], new_tokens: int, sampling: dict, repeats: int, n: int = 1
) -> tuple[float, list[list[int]], dict]:
    """The fastest of ``repeats`` runs: (seconds, outputs, :func:`decode_anatomy` of that run)."""
    best = None
    for _ in range(repeats):
        before = counters_of(engine.stats())
        seconds, outputs = run_engine(engine, prompts, new_tokens, sampling, n)
        anatomy = decode_anatomy(before, counters_of(engine.stats()), seconds)
        if best is None or seconds < best[0]:
            best = (seconds, outputs, anatomy)
    assert best is not None
    return best
