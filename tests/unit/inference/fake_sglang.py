"""An in-process fake of an SGLang server (native protocol) behind ``httpx.MockTransport``.

It checks request bodies against the field names of sglang 0.5.23 (unknown ``sampling_params``
keys are refused with 400, as SGLang does), generates a predictable sequence (each token is the
previous token + 1, so a stitched partial rollout can be checked token by token), honours pause
modes and weight updates, and lets a test inject failures: a dead server (connection refused),
error statuses, a hang, holding every request after N tokens until a pause aborts it, or keeping
requests in transit (not yet arrived) until the test lets them through. ``/abort_request`` records
the rid it was given in ``aborts`` and stops a generating request whose rid starts with it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

VOCAB = 1000
SGLANG_SAMPLING_KEYS = {
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
}
DISK_KEYS = {
    "model_path",
    "load_format",
    "abort_all_requests",
    "weight_version",
    "is_async",
    "torch_empty_cache",
    "keep_pause",
    "recapture_cuda_graph",
    "token_step",
    "flush_cache",
    "manifest",
}
DIST_KEYS = {
    "names",
    "dtypes",
    "shapes",
    "group_name",
    "flush_cache",
    "abort_all_requests",
    "weight_version",
    "load_format",
    "selector",
    "torch_empty_cache",
}
GROUP_KEYS = {"master_address", "master_port", "rank_offset", "world_size", "group_name", "backend"}


def logprob_of(version: str) -> float:
    """The logprob the fake gives every token of weights ``version`` (tells versions apart)."""
    return -1.0 - (int(version) if version.isdigit() else 0) / 10


@dataclass
class FakeSGLangServer:
    """One fake server; ``calls`` records ``(path, body)`` of every request it received."""

    address: str
    weight_version: str = "default"
    report_version: bool = True
    dead: bool = False
    hang: bool = False
    statuses: list[int] = field(default_factory=list)
    #: headers of the answers with an injected status (e.g. ``Retry-After`` of a 429)
    status_headers: dict[str, str] = field(default_factory=dict)
    hold_after: int | None = None
    #: when set, a /generate request is in transit (not yet at the server) until the event is set
    arrival: asyncio.Event | None = None
    fail_updates: bool = False
    abort_with: dict[str, Any] | None = None
    calls: list[tuple[str, Any]] = field(default_factory=list)
    #: rids of the /abort_request calls received, in order
    aborts: list[str] = field(default_factory=list)
    running: int = 0
    max_running: int = 0
    cluster: FakeCluster | None = None

    def __post_init__(self) -> None:
        self.paused = False
        #: paused ``retract``/``in_place``: sequences hold KV of the old weights (SGLang then fails
        #: an update that asks to flush the cache)
        self.kv_held = False
        self.session = False
        #: names of the weight-update groups this server is in (joined and not yet left)
        self.groups: set[str] = set()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._abort = asyncio.Event()
        self.release = asyncio.Event()
        self.reached = asyncio.Event()

    def generate_calls(self) -> list[dict[str, Any]]:
        return [body for path, body in self.calls if path == "/generate"]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.dead:
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content) if request.content else None
        self.calls.append((request.url.path, body))
        route = {
            "/generate": self._generate,
            "/abort_request": self._abort_request,
            "/health": self._health,
            "/get_model_info": self._model_info,
            "/pause_generation": self._pause,
            "/continue_generation": self._continue,
            "/update_weights_from_disk": self._update_disk,
            "/init_weights_update_group": self._init_group,
            "/destroy_weights_update_group": self._destroy_group,
            "/update_weights_from_distributed": self._update_dist,
            "/begin_weight_update": self._begin,
            "/end_weight_update": self._end,
        }.get(request.url.path)
        if route is None:
            return httpx.Response(404, json={"detail": "Not Found"})
        return await route(body)

    async def _health(self, body: Any) -> httpx.Response:
        return httpx.Response(200)

    async def _model_info(self, body: Any) -> httpx.Response:
        return httpx.Response(
            200, json={"model_path": "/fake", "weight_version": self.weight_version, "is_generation": True}
        )

    async def _generate(self, body: dict[str, Any]) -> httpx.Response:
        if self.statuses:
            status = self.statuses.pop(0)
            return httpx.Response(
                status, json={"error": {"message": f"injected {status}"}}, headers=self.status_headers
            )
        if self.hang:
            await asyncio.Event().wait()
        unknown = set(body["sampling_params"]) - SGLANG_SAMPLING_KEYS
        if unknown or body.get("stream") is not False or body.get("return_logprob") is not True:
            return httpx.Response(400, json={"error": f"bad request: unknown sampling keys {sorted(unknown)}"})
        if self.arrival is not None:
            await self.arrival.wait()
        await self._resumed.wait()  # SGLang holds new requests while paused
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        if self.cluster is not None:
            self.cluster.max_total_running = max(self.cluster.max_total_running, self.cluster.total_running)
        try:
            return await self._run(body)
        finally:
            self.running -= 1

    async def _run(self, body: dict[str, Any]) -> httpx.Response:
        params = body["sampling_params"]
        stop_ids = set(params.get("stop_token_ids", []))
        last = body["input_ids"][-1]
        out: list[int] = []
        finish: dict[str, Any] = {"type": "length", "length": params["max_new_tokens"]}
        while len(out) < params["max_new_tokens"]:
            if self.abort_with is not None:
                finish = dict(self.abort_with)
                break
            if self._abort.is_set() or any(body["rid"].startswith(r) for r in self.aborts):
                finish = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
                break
            if self.hold_after is not None and len(out) == self.hold_after and not self.release.is_set():
                self.reached.set()
                waiters = [asyncio.ensure_future(self._abort.wait()), asyncio.ensure_future(self.release.wait())]
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for waiter in waiters:
                    waiter.cancel()
                continue
            last = (last + 1) % VOCAB
            out.append(last)
            if last in stop_ids:
                finish = {"type": "stop", "matched": last}
                break
            await asyncio.sleep(0)
        lp = logprob_of(self.weight_version)
        meta: dict[str, Any] = {
            "id": body["rid"],
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "output_token_logprobs": [[lp, t, None] for t in out],
        }
        if self.report_version:
            meta["weight_version"] = self.weight_version
        return httpx.Response(200, json={"text": "", "output_ids": out, "meta_info": meta})

    async def _abort_request(self, body: dict[str, Any]) -> httpx.Response:
        assert set(body) <= {"rid", "abort_all"} and body["rid"] and not body.get("abort_all"), body
        self.aborts.append(body["rid"])
        return httpx.Response(200)

    async def _pause(self, body: dict[str, Any]) -> httpx.Response:
        assert set(body) <= {"mode"} and body.get("mode", "abort") in ("abort", "retract", "in_place"), body
        self.paused = True
        self.kv_held = body.get("mode", "abort") != "abort"
        self._resumed.clear()
        if body.get("mode", "abort") == "abort":
            self._abort.set()
            while self.running:
                await asyncio.sleep(0)
            self._abort.clear()
        return httpx.Response(200, json={"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, body: Any) -> httpx.Response:
        self.paused = False
        self.kv_held = False
        self._resumed.set()
        return httpx.Response(200, json={"message": "Generation continued successfully.", "status": "ok"})

    def _result(self, ok: bool) -> httpx.Response:
        if ok and not self.fail_updates:
            return httpx.Response(200, json={"success": True, "message": "Succeeded"})
        return httpx.Response(400, json={"success": False, "message": "injected update failure"})

    def _unflushable(self, body: dict[str, Any]) -> httpx.Response | None:
        """SGLang's answer to ``flush_cache: true`` while paused sequences hold KV, else None."""
        if self.kv_held and body.get("flush_cache", True):
            message = "Weights were updated, but the cache was not flushed: requests are still running"
            return httpx.Response(400, json={"success": False, "message": message})
        return None

    async def _update_disk(self, body: dict[str, Any]) -> httpx.Response:
        refused = self._unflushable(body)
        if refused is not None:
            return refused
        ok = set(body) <= DISK_KEYS and "model_path" in body
        if ok and not self.fail_updates and body.get("weight_version") is not None:
            self.weight_version = body["weight_version"]
        return self._result(ok)

    async def _init_group(self, body: dict[str, Any]) -> httpx.Response:
        ok = set(body) == GROUP_KEYS and body["group_name"] not in self.groups  # as SGLang: no second join
        if ok:
            self.groups.add(body["group_name"])
        return self._result(ok)

    async def _destroy_group(self, body: dict[str, Any]) -> httpx.Response:
        ok = set(body) == {"group_name"} and body["group_name"] in self.groups
        self.groups.discard(body.get("group_name"))
        return self._result(ok)

    async def _begin(self, body: dict[str, Any]) -> httpx.Response:
        ok = not self.session and set(body) <= {"selector"}
        self.session = True
        return self._result(ok)

    async def _end(self, body: dict[str, Any]) -> httpx.Response:
        ok, self.session = self.session, False
        return self._result(ok)

    async def _update_dist(self, body: dict[str, Any]) -> httpx.Response:
        if not self.session:  # as sglang 0.5.23
            return self._result(False)
        refused = self._unflushable(body)
        if refused is not None:
            return refused
        ok = set(body) <= DIST_KEYS and len(body["names"]) == len(body["dtypes"]) == len(body["shapes"])
        if ok and not self.fail_updates and body.get("weight_version") is not None:
            self.weight_version = body["weight_version"]
        return self._result(ok)


class FakeCluster:
    """Several fake servers behind one MockTransport, addressed ``127.0.0.1:<9000+i>``."""

    def __init__(self, n: int) -> None:
        self.servers = [FakeSGLangServer(f"http://127.0.0.1:{9000 + i}", cluster=self) for i in range(n)]
        self.max_total_running = 0
        self._by_netloc = {s.address.removeprefix("http://"): s for s in self.servers}

    @property
    def total_running(self) -> int:
        return sum(s.running for s in self.servers)

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.servers]

    def transport(self) -> httpx.MockTransport:
        async def handler(request: httpx.Request) -> httpx.Response:
            server = self._by_netloc.get(f"{request.url.host}:{request.url.port}")
            if server is None:
                raise httpx.ConnectError("no such server", request=request)
            return await server.handle(request)

        return httpx.MockTransport(handler)


def make_engine(cluster: FakeCluster, sleeps: list[float] | None = None, version: int = 0, **config: Any) -> Any:
    """A client over ``cluster`` (jitter off, 0.1 s first backoff); backoff sleeps go to ``sleeps``."""
    from areal_tasks.inference.client import ClientConfig, RemoteInferenceEngine, make_adapter

    async def record(delay: float) -> None:
        if sleeps is not None:
            sleeps.append(delay)

    cfg = ClientConfig(**{"retry_backoff_s": 0.1, "retry_jitter": 0.0, "max_retries": 2, **config})
    return RemoteInferenceEngine(
        cluster.addresses,
        make_adapter("sglang"),
        cfg,
        version=version,
        sleep=record,
        transport_factory=cluster.transport,
    )
