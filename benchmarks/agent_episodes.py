"""What an agent costs per episode, apart from generation: the example agents through their workflows.

Each row runs ``--episodes`` episodes (``--concurrency`` at a time) of one example agent's workflow
against a scripted engine that answers ``Answer: 5`` at once, so what is measured is the agent side
alone: ``ArealOpenAI`` in-process (``agent``), or a program per episode under a proxy session
(``agent_command``), started by exec or forked from a fork server that preloaded its SDK
(``preload``). CPU is the whole machine's busy time over the run (this process, the proxy, the
programs and the fork server): run it on an otherwise idle machine. It prints a table and writes
``benchmarks/results/agent_episodes.json``.

    python benchmarks/agent_episodes.py                 # all rows (openai-agents rows need `make agents-env`)
    python benchmarks/agent_episodes.py --episodes 64 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from areal_tasks.agent.command_workflow import AgentCommandWorkflow
from areal_tasks.agent.workflow import AgentWorkflow
from areal_tasks.api.inference import InferenceEngine, ModelRequest, ModelResponse, SamplingParams
from areal_tasks.datasets.registry import Record
from areal_tasks.datasets.reward import arithmetic_reward
from areal_tasks.models.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "agent_episodes.json"
AGENTS_PYTHON = ROOT / ".venv-agents" / "bin" / "python"
RECORD = Record("Which is larger, 2 or 5?", "5")


class AnswerAtOnce(InferenceEngine):
    """Answers every request with ``Answer: 5`` and its end-of-turn token, without generating."""

    def __init__(self, tokenizer: Any) -> None:
        self.ids = [*tokenizer.encode("Answer: 5", add_special_tokens=False), int(tokenizer.eos_token_id)]

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        n = len(self.ids)
        return ModelResponse(req.rid, list(req.input_ids), list(self.ids), [-0.1] * n, [0] * n, "stop", 0.0, 0.0)

    def get_version(self) -> int:
        return 0

    def set_version(self, version: int) -> None:
        """The scripted engine has no weights to version."""

    async def pause(self, mode: Any = "abort") -> None:
        """Nothing generates, so nothing to pause."""

    async def resume(self) -> None:
        """Nothing generates, so nothing to resume."""

    async def update_weights(self, meta: Any, buckets: Any = None) -> None:
        """The scripted engine has no weights."""

    async def aclose(self) -> None:
        """Nothing to close."""


def preload(example: str) -> list[str]:
    """The ``preload`` list of ``configs/agent_<example>.yaml``."""
    from areal_tasks.config import load_config

    cfg = load_config(str(ROOT / "configs" / f"agent_{example}.yaml"), [])
    return list(cfg.rollout.workflow.options["preload"])


def rows(agents_venv: bool) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, workflow, options)`` of each measured setup."""
    sdk = ["{python}", str(ROOT / "examples/agents/openai_sdk_agent.py")]
    out = [
        ("ArealOpenAI in-process", "agent", {"agent": f"{ROOT}/examples/agents/calculator_agent.py:run"}),
        ("openai SDK program, exec", "agent_command", {"command": sdk}),
        ("openai SDK program, fork: the SDK", "agent_command", {"command": sdk, "preload": ["openai"]}),
        ("openai SDK program, fork: config", "agent_command", {"command": sdk, "preload": preload("openai_sdk")}),
    ]
    if agents_venv:
        agents = [str(AGENTS_PYTHON), str(ROOT / "examples/agents/openai_agents_sdk_agent.py")]
        env = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}
        out += [
            ("openai-agents program, exec", "agent_command", {"command": agents, "env": env}),
            (
                "openai-agents program, fork: SDKs",
                "agent_command",
                {"command": agents, "env": env, "preload": ["agents", "openai"]},
            ),
            (
                "openai-agents program, fork: config",
                "agent_command",
                {"command": agents, "env": env, "preload": preload("openai_agents")},
            ),
        ]
    return out


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (user + nice + system, all CPUs): forked agent
    programs are children of the fork server, not of this process, so its rusage would miss them."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:4]
    return sum(int(f) for f in fields) / os.sysconf("SC_CLK_TCK")


async def measure(workflow: Any, engine: InferenceEngine, episodes: int, concurrency: int) -> dict[str, float]:
    """Wall and CPU seconds per episode (the first, warming episode excluded)."""
    limit = asyncio.Semaphore(concurrency)
    try:
        await workflow.arun_episode(engine, RECORD)  # starts the proxy / fork server
        cpu0, t0 = machine_cpu_s(), time.perf_counter()
        bar = tqdm(total=episodes, leave=False, desc=type(workflow).__name__)

        async def one() -> None:
            async with limit:
                traj = await workflow.arun_episode(engine, RECORD)
                if traj is None or traj.reward != 1.0:
                    raise RuntimeError(f"an episode did not train on the scripted answer: {traj}")
                bar.update()

        await asyncio.gather(*(one() for _ in range(episodes)))
        bar.close()
        wall = time.perf_counter() - t0
        cpu = machine_cpu_s() - cpu0
    finally:
        close = getattr(workflow, "aclose", None)
        if close is not None:
            await close()
    return {
        "wall_ms_per_episode": 1000 * wall / episodes,
        "episodes_per_s": episodes / wall,
        "cpu_ms_per_episode": 1000 * cpu / episodes,
    }


async def reward(completion: str, answer: str) -> float:
    return arithmetic_reward(completion, answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    tokenizer = load_tokenizer("tiny")
    sampling = SamplingParams(max_new_tokens=8)
    engine = AnswerAtOnce(tokenizer)
    results = []
    for name, kind, options in rows(AGENTS_PYTHON.is_file()):
        cls = AgentWorkflow if kind == "agent" else AgentCommandWorkflow
        workflow = cls(tokenizer, sampling, reward, **options)
        figures = asyncio.run(measure(workflow, engine, args.episodes, args.concurrency))
        results.append({"setup": name, "workflow": kind, **figures})
    print(f"\n{args.episodes} episodes per row, {args.concurrency} at a time, {os.cpu_count()} CPUs")
    print(f"{'setup':<36} {'ms/episode (wall)':>18} {'episodes/s':>11} {'CPU ms/episode':>15}")
    for r in results:
        print(
            f"{r['setup']:<36} {r['wall_ms_per_episode']:>18.1f} {r['episodes_per_s']:>11.1f} "
            f"{r['cpu_ms_per_episode']:>15.1f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = {"episodes": args.episodes, "concurrency": args.concurrency, "cpus": os.cpu_count(), "rows": results}
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
