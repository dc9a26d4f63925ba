"""The embedded server's operations as coroutines: generation, pause/continue, weights, cache.

:class:`EmbeddedServer` sits between the HTTP routes and the :class:`Engine` thread. Generation
turns each prompt into ``n`` sequences and awaits them; control and weight operations run inside
the engine loop between two decode steps (:meth:`Engine.call`), slow parts (reading safetensors,
receiving broadcasts, the rendezvous) run in worker threads first.

Weight updates live in :class:`~areal_tasks.inference.server.weight_service.WeightService`
(``server.weights``). ``/get_model_info`` and every ``/generate`` answer report the weight version;
a sequence that spans an update carries SGLang's ``weight_versions`` spans.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import replace
from typing import Any

from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner
from areal_tasks.inference.server.protocol import generate_response
from areal_tasks.inference.server.request import Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams
from areal_tasks.inference.server.server import WeightBounds
from areal_tasks.inference.server.weight_service import WeightService

logger = logging.getLogger(__name__)


class EmbeddedServer:
    """Async facade over one engine (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        model_path: str,
        served_model_name: str,
        tool_call_parser: str | None = None,
        weight_bounds: WeightBounds | None = None,
    ) -> None:
        self.engine = engine
        self.tool_call_parser = tool_call_parser
        self.runner: ModelRunner = engine.runner
        self.tokenizer = self.runner.tokenizer
        self.model_path = model_path
        self.served_model_name = served_model_name
        self.weights = WeightService(engine, weight_bounds)

    # ---------------- generation ----------------
    async def generate_sequences(self, items: list[dict[str, Any]]) -> list[Sequence]:
        """Run every item (``input_ids``, ``sampling_params``, ``rid``, ``return_logprob``,
        ``logprob_start_len``) with its ``n`` samples; returns the finished sequences in order."""
        loop = asyncio.get_running_loop()
        seqs: list[Sequence] = []
        futures: list[asyncio.Future[Sequence]] = []

        def on_finish(seq: Sequence, fut: asyncio.Future) -> None:
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(seq))

        for item in items:
            params = SamplingParams.from_dict(item["sampling_params"])
            group = SequenceGroup(prompt_ids=[int(t) for t in item["input_ids"]])
            base_rid = item["rid"] or uuid.uuid4().hex
            for j in range(params.n):
                fut: asyncio.Future[Sequence] = loop.create_future()
                seed = None if params.sampling_seed is None else params.sampling_seed + j
                seq = Sequence(
                    rid=base_rid if params.n == 1 else f"{base_rid}_{j}",
                    group=group,
                    params=params if seed == params.sampling_seed else _with_seed(params, seed),
                    on_finish=lambda s, f=fut: on_finish(s, f),
                    return_logprob=item["return_logprob"],
                    logprob_start_len=item["logprob_start_len"],
                )
                seqs.append(seq)
                futures.append(fut)
        self.engine.submit(seqs)
        return list(await asyncio.gather(*futures))

    def output_text(self, seq: Sequence) -> str:
        """The decoded output with SGLang's stop trimming (matched stop token / string removed)."""
        ids = seq.output_ids
        matched = (seq.finish_reason or {}).get("matched")
        trim = not seq.params.no_stop_trim
        if trim and isinstance(matched, int) and ids:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=seq.params.skip_special_tokens)
        if isinstance(matched, str):
            pos = text.find(matched)
            if pos >= 0:
                text = text[: pos + len(matched)] if not trim else text[:pos]
        return text

    def response(self, seq: Sequence, return_text_in_logprobs: bool = False) -> dict[str, Any]:
        """SGLang's ``/generate`` answer for ``seq``."""
        decode = (lambda t: self.tokenizer.decode([t])) if return_text_in_logprobs else None
        return generate_response(seq, self.output_text(seq), decode)

    # ---------------- pause / continue / abort / cache ----------------
    async def pause(self, mode: str) -> int:
        return await asyncio.wrap_future(self.engine.call(lambda: self.engine.pause(mode)))

    async def resume(self) -> None:
        await asyncio.wrap_future(self.engine.call(self.engine.resume))

    async def abort(self, rid: str, abort_all: bool) -> int:
        if abort_all:
            return await asyncio.wrap_future(
                self.engine.call(lambda: self.engine.abort_all("aborted by abort_request"))
            )
        return await asyncio.wrap_future(self.engine.call(lambda: self.engine.abort_rid(rid)))

    async def flush_cache(self) -> tuple[bool, str]:
        """SGLang refuses to flush while requests run or wait; otherwise the KV storage is dropped."""

        def flush() -> tuple[bool, str]:
            if not self.engine.is_idle():
                return False, "Cache not flushed: there are running or waiting requests."
            self.runner.cache.clear()
            return True, "Cache flushed."

        return await asyncio.wrap_future(self.engine.call(flush))

    # ---------------- info ----------------
    def model_info(self) -> dict[str, Any]:
        config = self.runner.config
        return {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.runner.cfg.tokenizer_path or self.runner.cfg.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.engine.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": self.tool_call_parser,
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": getattr(config, "model_type", None),
            "architectures": getattr(config, "architectures", None),
        }


def _with_seed(params: SamplingParams, seed: int | None) -> SamplingParams:
    return replace(params, sampling_seed=seed)
