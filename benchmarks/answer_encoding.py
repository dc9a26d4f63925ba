"""What a ``/generate`` answer with log-probs costs to write (server) and to read (RL client).

RL asks every call for its log-probs, so an answer of ``n`` tokens carries ``n``
``[logprob, token_id, null]`` triples. The server writes it on the event loop that shares the
interpreter lock with the engine thread; the client reads it in the rollout process. For answers
of ``--tokens`` tokens (built by the server's own ``generate_response`` from a finished sequence),
this times Starlette's ``JSONResponse`` (the standard library's ``json``, before) against
``JsonAnswer`` (msgspec, ``inference/server/json_answer.py``), and ``json.loads`` against the
client's ``decode_reply`` (``inference/client/transport.py``): the best of ``--repeats`` runs of
``--calls`` each, microseconds an answer. A second kind of row is a ``/v1/chat/completions``
answer with ``logprobs`` and 5 ``top_logprobs`` a token (the agents' path), written before through
FastAPI's ``jsonable_encoder`` then ``JSONResponse``, now by ``JsonAnswer``; its reader is the
OpenAI SDK, not timed here.

Prints a table and writes JSON (``benchmarks/results/answer_encoding_cpu.json`` by default).

Usage::

    python benchmarks/answer_encoding.py
    python benchmarks/answer_encoding.py --tokens 64,256,1024,4096 --calls 2000
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.encoders import jsonable_encoder
from starlette.responses import JSONResponse

from areal_tasks.inference.client.transport import decode_reply
from areal_tasks.inference.server.json_answer import JsonAnswer
from areal_tasks.inference.server.openai_logprobs import chat_logprobs
from areal_tasks.inference.server.protocol import generate_response
from areal_tasks.inference.server.request import Sequence, SequenceGroup
from areal_tasks.inference.server.sampling import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results"
JSON_HEADERS = {"content-type": "application/json"}


def answer(tokens: int, seed: int = 0) -> dict[str, Any]:
    """The server's answer for a finished sequence of ``tokens`` sampled tokens with their log-probs."""
    rng = random.Random(seed)
    params = SamplingParams.from_dict({"max_new_tokens": tokens, "temperature": 1.0})
    group = SequenceGroup(prompt_ids=[rng.randrange(150_000) for _ in range(128)])
    seq = Sequence(rid="a" * 32, group=group, params=params, on_finish=lambda _: None, return_logprob=True)
    for _ in range(tokens):
        seq.output_ids.append(rng.randrange(150_000))
        seq.output_logprobs.append(-rng.random() * 8)
    seq.finish_reason = {"type": "length", "length": tokens}
    seq.finish_version = "0"
    return generate_response(seq, "x" * (tokens * 3))


class _Words:
    """A tokenizer for :func:`chat_answer`: token ``t`` is the word ``w<t mod 1000>``."""

    def decode(self, ids: list[int]) -> str:
        return f" w{ids[0] % 1000}"

    def convert_ids_to_tokens(self, token_id: int) -> None:
        return None  # no vocabulary piece: the bytes come from decode, as for any tokenizer without one


def chat_answer(tokens: int, seed: int = 0) -> dict[str, Any]:
    """A chat completion of ``tokens`` tokens with their log-probs and 5 alternatives each."""
    rng = random.Random(seed)
    ids = [rng.randrange(150_000) for _ in range(tokens)]
    values = [-rng.random() * 8 for _ in range(tokens)]
    tops = [[(rng.randrange(150_000), -rng.random() * 10) for _ in range(5)] for _ in range(tokens)]
    return {
        "id": "chatcmpl-" + "a" * 32,
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x" * (tokens * 3), "tool_calls": None},
                "logprobs": chat_logprobs(_Words(), ids, values, tops),
                "finish_reason": "length",
                "matched_stop": None,
            }
        ],
        "usage": {"prompt_tokens": 128, "completion_tokens": tokens, "total_tokens": 128 + tokens},
        "metadata": {"weight_version": "0"},
    }


def best_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``calls`` calls of ``fn``: microseconds a call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return 1e6 * best


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="64,256,1024", help="comma-separated answer lengths")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    rows: list[dict[str, Any]] = []
    chats: list[dict[str, Any]] = []
    for tokens in [int(t) for t in args.tokens.split(",") if t]:
        content = answer(tokens)
        body = JSONResponse(content).body
        if json.loads(JsonAnswer(content).body) != json.loads(body) or decode_reply("", JSON_HEADERS, body) != content:
            raise SystemExit(f"the encodings of a {tokens}-token answer disagree")
        row = {
            "tokens": tokens,
            "bytes": len(body),
            "write_json_us": best_us(lambda c=content: JSONResponse(c), args.calls, args.repeats),
            "write_msgspec_us": best_us(lambda c=content: JsonAnswer(c), args.calls, args.repeats),
            "read_json_us": best_us(lambda b=body: json.loads(b), args.calls, args.repeats),
            "read_client_us": best_us(lambda b=body: decode_reply("", JSON_HEADERS, b), args.calls, args.repeats),
        }
        rows.append(row)
        print(
            f"measured: {tokens} tokens: write {row['write_json_us']:.1f} -> {row['write_msgspec_us']:.1f} us",
            flush=True,
        )
        chat = chat_answer(tokens)
        if json.loads(JsonAnswer(chat).body) != json.loads(JSONResponse(jsonable_encoder(chat)).body):
            raise SystemExit(f"the encodings of a {tokens}-token chat answer disagree")
        chats.append(
            {
                "tokens": tokens,
                "bytes": len(JsonAnswer(chat).body),
                "write_fastapi_us": best_us(
                    lambda c=chat: JSONResponse(jsonable_encoder(c)), max(1, args.calls // 10), args.repeats
                ),
                "write_msgspec_us": best_us(lambda c=chat: JsonAnswer(c), args.calls, args.repeats),
            }
        )

    print(
        f"\n/generate answers with log-probs on {platform.machine()}, microseconds an answer (best of {args.repeats})"
    )
    print(
        f"{'tokens':>7s} {'bytes':>8s} {'write json':>11s} {'write msgspec':>14s} "
        f"{'read json':>10s} {'read client':>12s}"
    )
    for r in rows:
        print(
            f"{r['tokens']:7d} {r['bytes']:8d} {r['write_json_us']:11.1f} {r['write_msgspec_us']:14.1f} "
            f"{r['read_json_us']:10.1f} {r['read_client_us']:12.1f}"
        )
    print("(write: the server's response object, rendering included; read: the client's parse of the body)")
    print("\n/v1/chat/completions answers with logprobs and 5 top_logprobs, microseconds an answer")
    print(f"{'tokens':>7s} {'bytes':>8s} {'write FastAPI':>14s} {'write msgspec':>14s}")
    for r in chats:
        print(f"{r['tokens']:7d} {r['bytes']:8d} {r['write_fastapi_us']:14.1f} {r['write_msgspec_us']:14.1f}")
    out = args.out or RESULTS / "answer_encoding_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"config": vars(args) | {"out": str(out)}, "rows": rows, "chat_rows": chats}
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
