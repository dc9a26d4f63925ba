"""A scripted engine for the agent tests: the rollout tests' FakeEngine (replies as text, EOS
appended unless ``eos=False``, deterministic log-probs and versions, every request recorded)."""

from __future__ import annotations

from tests.unit.rollout.workflow_fakes import FakeEngine, Reply

__all__ = ["FakeEngine", "Reply", "call_text"]


def call_text(*calls: tuple[str, str]) -> str:
    """A model's canonical Hermes tool-call text for ``(name, arguments JSON)`` pairs."""
    return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>' for n, a in calls)
