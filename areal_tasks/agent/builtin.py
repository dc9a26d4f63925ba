"""The built-in agent: one chat turn, as the ``rlvr`` workflow does it, but through the OpenAI client.

:func:`chat_once` is the ``agent`` workflow's default: the system prompt (``rollout.workflow.system_prompt``)
and the item's prompt as a user message, one completion, no reward of its own (the job's reward
function scores the answer). It is also the smallest example of the agent contract
``async def run(client, data) -> float | None``.
"""

from __future__ import annotations

from typing import Any

from areal_tasks.rollout.workflows.rlvr import item_fields

__all__ = ["chat_once"]


async def chat_once(client: Any, data: Any, *, system_prompt: str | None = None) -> None:
    """Ask the item's prompt once; the reward comes from the job's reward function."""
    prompt, _ = item_fields(data)
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": prompt})
    await client.chat.completions.create(model="default", messages=messages)
