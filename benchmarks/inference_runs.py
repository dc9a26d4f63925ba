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


def timed_engine_run(
    engine, prompts: list[list[int]], new_tokens: int, sampling: dict, repeats: int, n: int = 1
) -> tuple[float, list[list[int]], dict]:
    """The fastest of ``repeats`` runs: (seconds, outputs, decode anatomy). The anatomy comes from
    the engine's decode counters over that run: steps, host milliseconds a step and the part of
    them the host waited for the device (near the whole step: device-bound; near zero: host-bound),
    and the prompt tokens prefilled and those whose KV was reused (``n > 1`` siblings, prefix hits)."""
    best = None
    for _ in range(repeats):
        before = engine.stats()
        seconds, outputs = run_engine(engine, prompts, new_tokens, sampling, n)
        after = engine.stats()
        steps = after.decode_steps_total - before.decode_steps_total
        host = after.decode_seconds_total - before.decode_seconds_total
        waited = after.decode_wait_seconds_total - before.decode_wait_seconds_total
        anatomy = {
            "decode_steps": steps,
            "ms_per_step": 1e3 * host / max(steps, 1),
            "wait_ms_per_step": 1e3 * waited / max(steps, 1),
            "prefilled_tokens": after.prompt_tokens_total - before.prompt_tokens_total,
            "reused_prompt_tokens": after.cached_tokens_total - before.cached_tokens_total,
        }
        if best is None or seconds < best[0]:
            best = (seconds, outputs, anatomy)
    assert best is not None
    return best
