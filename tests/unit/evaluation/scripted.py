"""A scripted inference engine for the harness tests: each prompt gets the completions a test wrote
for it, in order, one per request (the tiny tokenizer encodes them), so the figures are known."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from areal_tasks.api.inference import ModelRequest, ModelResponse


class ScriptedEngine:
    """``script[question] = [completion of sample 0, sample 1, ...]``; lengths of what it sent in ``sent``."""

    def __init__(self, tokenizer: Any, script: dict[str, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.calls: dict[str, int] = defaultdict(int)
        self.sent: list[int] = []
        self.closed = False

    def _question(self, input_ids: list[int]) -> str:
        text = self.tokenizer.decode(input_ids)
        matches = [q for q in self.script if q in text]
        assert len(matches) == 1, f"prompt matches {matches} of the script: {text!r}"
        return matches[0]

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        question = self._question(request.input_ids)
        completion = self.script[question][self.calls[question]]
        self.calls[question] += 1
        ids = self.tokenizer.encode(completion, add_special_tokens=False)
        self.sent.append(len(ids))
        return ModelResponse(
            rid=request.rid,
            input_ids=list(request.input_ids),
            output_ids=ids,
            output_logprobs=[0.0] * len(ids),
            output_versions=[0] * len(ids),
            stop_reason="stop",
            ttft_s=0.0,
            latency_s=0.0,
        )

    async def aclose(self) -> None:
        self.closed = True
