"""The ``agent_command`` workflow's default program: one chat turn through the official ``openai`` SDK.

Reads the task as JSON on stdin (``{"prompt": ..., "system_prompt": ...}``), asks once with
``openai.OpenAI()`` (which reads ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` from the environment, as
the workflow sets them) and prints the answer as JSON on stdout. It knows nothing of training: the
proxy records the call and the job's reward function scores it. Run: ``python -m
areal_tasks.agent.sdk_chat_once < task.json``.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    """Ask once; print ``{"answer": ...}``."""
    from openai import OpenAI

    task = json.load(sys.stdin)
    messages = [{"role": "system", "content": task["system_prompt"]}] if task.get("system_prompt") else []
    messages.append({"role": "user", "content": task["prompt"]})
    with OpenAI(max_retries=0) as client:
        completion = client.chat.completions.create(model="default", messages=messages)
    json.dump({"answer": completion.choices[0].message.content}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
