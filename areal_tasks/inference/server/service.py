"""The embedded server's operations as coroutines: generation, pause/continue, weights, cache.

:class:`EmbeddedServer` sits between the HTTP routes and the :class:`Engine` thread. Generation
turns each prompt into ``n`` sequences and awaits them; control and weight operations run inside
the engine loop between two decode steps (:meth:`Engine.call`), slow parts (reading safetensors,
receiving broadcasts, the rendezvous) run in worker threads first.

Weight versions: SGLang's ``weight_version`` string is this server's policy version. An update
that names a ``weight_version`` sets it; a disk update without one bumps it (``int + 1`` while it
is an integer, otherwise the count of updates so far); a collective session (begin ... end) without
one bumps it once, at ``end_weight_update``. ``/get_model_info`` and every ``/generate`` answer
report it; a sequence that spans an update carries SGLang's ``weight_versions`` spans.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, replace
from typing import Any

from areal_tasks.errors import InferenceError
from areal_tasks.inference.server.engine import Engine
from areal_tasks.inference.server.model_runner import ModelRunner
from areal_tasks.inference.server.protocol import generate_response
from areal_tasks.inference.server.request import Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams
from areal_tasks.inference.server import weights as weight_io

logger = logging.getLogger(__name__)


@dataclass
class _Session:
    """An open ``begin_weight_update`` ... ``end_weight_update`` session."""

    loaded: bool = False
    versioned: bool = False


class EmbeddedServer:
    """Async facade over one engine (see the module doc)."""

    def __init__(self, engine: Engine, model_path: str, served_model_name: str,
                 tool_call_parser: str | None = None) -> None:
        self.engine = engine
        self.tool_call_parser = tool_call_parser
        self.runner: ModelRunner = engine.runner
        self.tokenizer = self.runner.tokenizer
        self.model_path = model_path
        self.served_model_name = served_model_name
        self.groups: dict[str, weight_io.WeightUpdateGroup] = {}
        self.session: _Session | None = None
        self.updates = 0
        self._weights_lock = asyncio.Lock()

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
        return generate_response(seq, self.output_text(seq), self.engine.weight_version, decode)

    # ---------------- pause / continue / abort / cache ----------------
    async def pause(self, mode: str) -> int:
        return await asyncio.wrap_future(self.engine.call(lambda: self.engine.pause(mode)))

    async def resume(self) -> None:
        await asyncio.wrap_future(self.engine.call(self.engine.resume))

    async def abort(self, rid: str, abort_all: bool) -> int:
        if abort_all:
            return await asyncio.wrap_future(self.engine.call(lambda: self.engine.abort_all("aborted by abort_request")))
        return await asyncio.wrap_future(self.engine.call(lambda: self.engine.abort_rid(rid)))

    async def flush_cache(self) -> tuple[bool, str]:
        """SGLang refuses to flush while requests run or wait; otherwise the KV storage is dropped."""

        def flush() -> tuple[bool, str]:
            if not self.engine.is_idle():
                return False, "Cache not flushed: there are running or waiting requests."
            self.runner.cache.clear()
            return True, "Cache flushed."

        return await asyncio.wrap_future(self.engine.call(flush))

    # ---------------- weights ----------------
    def _next_version(self) -> str:
        current = self.engine.weight_version
        return str(int(current) + 1) if current.lstrip("-").isdigit() else str(self.updates)

    async def _apply(self, named: dict, version: str | None) -> None:
        """Copy staged tensors into the model between two steps; set ``version`` if given."""

        def apply() -> None:
            self.runner.load_weights(named.items())
            self.engine.weights_changed(version)

        await asyncio.wrap_future(self.engine.call(apply))

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None,
                                       abort_all: bool, load_format: str | None) -> tuple[bool, str]:
        if load_format not in (None, "auto", "safetensors"):
            return False, f"load_format {load_format!r} is not supported (use auto or safetensors)"
        async with self._weights_lock:
            if abort_all:
                await self.abort("", abort_all=True)
            try:
                named = await asyncio.to_thread(
                    weight_io.load_safetensors_dir, model_path, self.runner.weight_specs(),
                    self.runner.required_weight_names(), self.runner.device,
                )
            except (InferenceError, OSError, ValueError) as exc:
                logger.error("update_weights_from_disk(%s) failed: %s", model_path, exc)
                return False, f"Failed to update weights: {exc}"
            self.updates += 1
            version = weight_version if weight_version is not None else self._next_version()
            await self._apply(named, version)
            self.model_path = model_path
        logger.info("loaded weights from %s as version %s", model_path, version)
        return True, "Succeeded to update model weights."

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str) -> tuple[bool, str]:
        if group_name in self.groups:
            return False, f"Failed to initialize custom process group: group {group_name!r} exists."
        try:
            group = await asyncio.to_thread(
                weight_io.init_weights_update_group, master_address, master_port, rank_offset,
                world_size, group_name, backend, self.runner.device,
            )
        except (InferenceError, RuntimeError, ValueError) as exc:
            logger.error("init_weights_update_group(%s) failed: %s", group_name, exc)
            return False, f"Failed to initialize custom process group: {exc}."
        self.groups[group_name] = group
        return True, "Succeeded to initialize custom process group."

    async def destroy_weights_update_group(self, group_name: str) -> tuple[bool, str]:
        group = self.groups.pop(group_name, None)
        if group is None:
            return False, "The group to be destroyed does not exist."
        await asyncio.to_thread(group.destroy)
        return True, "Succeeded to destroy custom process group."

    def begin_weight_update(self) -> tuple[bool, str]:
        if self.session is not None:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session = _Session()
        return True, "Success"

    async def end_weight_update(self) -> tuple[bool, str]:
        if self.session is None:
            return False, "no weight-update session is open; call begin_weight_update() first"
        session, self.session = self.session, None
        if session.loaded and not session.versioned:
            async with self._weights_lock:
                self.updates += 1
                await self._apply({}, self._next_version())
        return True, "Success"

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                              group_name: str, weight_version: str | None, abort_all: bool,
                                              load_format: str | None) -> tuple[bool, str]:
        if self.session is None:
            return False, ("update_weights_from_distributed must run between "
                           "begin_weight_update() and end_weight_update()")
        group = self.groups.get(group_name)
        if group is None:
            return False, f"Failed to receive weights: group {group_name!r} is not initialized"
        async with self._weights_lock:
            if abort_all:
                await self.abort("", abort_all=True)
            try:
                named = await asyncio.to_thread(weight_io.receive_weights, group, names, dtypes, shapes, load_format)
                weight_io.check_tensors(named, self.runner.weight_specs(), None)
            except (InferenceError, RuntimeError, ValueError) as exc:
                logger.error("update_weights_from_distributed failed: %s", exc)
                return False, f"Failed to receive weights: {exc}"
            await self._apply(named, weight_version)
            self.session.loaded = True
            self.session.versioned |= weight_version is not None
        message = "Succeeded to update parameter online."
        if weight_version is not None:
            message += f" Weight version updated to {weight_version}."
        return True, message

    async def update_weight_version(self, new_version: str, abort_all: bool) -> None:
        if abort_all:
            await self.abort("", abort_all=True)
        await self._apply({}, new_version)

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

