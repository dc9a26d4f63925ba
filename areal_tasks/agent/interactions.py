"""Every completion of an agent episode, linked into conversations, rewarded and exported.

An :class:`Interaction` is one generated choice: the exact prompt ids the engine saw, the output ids
with their behaviour log-probs and policy versions, and what the agent got back (the message, the
finish reason, the SDK object). :class:`InteractionCache` holds an episode's interactions in order
and links each chat request to its *parent*: the interaction whose messages plus returned message
the request's messages extend (the longest such, the latest on a tie); the client then builds the
request's prompt from the parent's ids (``chat_render.py``).

Rewards: :meth:`InteractionCache.set_reward` by completion id, :meth:`~InteractionCache.set_last_reward`
on the newest interaction. :meth:`~InteractionCache.apply_discount` runs once, leaves first: each
interaction's reward becomes its own (0 if unset) plus ``gamma`` times its children's (their mean
where the conversation branched). Export applies nothing implicitly: a reward still unset exports
as 0.0, and without :meth:`apply_discount` earlier turns keep only their own rewards.

Export (:meth:`InteractionCache.export`): ``"individual"``, one :class:`Trajectory` per interaction
(its prompt, then its output: the only trained tokens); ``"concat"``, one per leaf (an interaction
no later one extends) holding the whole conversation from its root: trained exactly on the tokens
the model generated, never on bridges (template text, tool results, user turns), with the leaf's
reward and the root's prompt length.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from areal_tasks.agent.chat_render import same_message
from areal_tasks.api.workflow import Trajectory
from areal_tasks.errors import AgentError

logger = logging.getLogger(__name__)

__all__ = ["ExportStyle", "Interaction", "InteractionCache"]

ExportStyle = Literal["concat", "individual"]


@dataclass
class Interaction:
    """One generated choice and what the agent received for it."""

    #: the cache key: the completion id (``chatcmpl-...``; ``<id>-<index>`` for choice index > 0 of n).
    id: str
    #: the request's messages as plain dicts (empty for a text completion).
    messages: list[dict[str, Any]]
    #: the template's text of ``messages`` with the generation prompt (the raw prompt for a text completion).
    prompt_text: str
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    #: the returned assistant message (``role``, ``content``, ``tool_calls``); None for text completions.
    message: dict[str, Any] | None
    #: OpenAI's finish reason: ``stop``, ``length`` or ``tool_calls``.
    finish_reason: str
    #: the interaction this one extends (None: a conversation's root).
    parent_id: str | None = None
    #: the tools rendered into the prompt (None: none).
    tools: list[dict[str, Any]] | None = None
    #: the stop token the output ends with (its end-of-turn token), None when it stopped otherwise.
    ended_with: int | None = None
    reward: float | None = None
    created: float = field(default_factory=time.time)
    #: the SDK object returned to the agent (ChatCompletion, Completion or Response).
    completion: Any = None

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.output_logprobs) != n or len(self.output_versions) != n:
            raise AgentError(f"interaction {self.id}: output ids, logprobs and versions differ in length")

    def extended_by(self, messages: list[dict[str, Any]]) -> bool:
        """Whether ``messages`` are this interaction's messages, then its returned message, then more."""
        n = len(self.messages)
        if self.message is None or not self.messages or len(messages) <= n:
            return False
        head = zip(messages[:n], self.messages)
        return all(same_message(a, b) for a, b in head) and same_message(messages[n], self.message)


class InteractionCache:
    """An episode's interactions, in the order they were made; ``cache[id]``, ``len``, ``iter``."""

    def __init__(self) -> None:
        self._items: dict[str, Interaction] = {}
        self._discounted = False

    def __getitem__(self, completion_id: str) -> Interaction:
        try:
            return self._items[completion_id]
        except KeyError:
            raise KeyError(f"no interaction {completion_id!r} in the cache") from None

    def __contains__(self, completion_id: object) -> bool:
        return completion_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Interaction]:
        return iter(list(self._items.values()))

    def add(self, interaction: Interaction) -> None:
        """Record ``interaction`` (its id must be new; its parent, if any, already recorded)."""
        if interaction.id in self._items:
            raise AgentError(f"interaction {interaction.id!r} is already recorded")
        if interaction.parent_id is not None and interaction.parent_id not in self._items:
            raise AgentError(f"interaction {interaction.id!r}: parent {interaction.parent_id!r} is not recorded")
        self._items[interaction.id] = interaction

    def parent_of(self, messages: list[dict[str, Any]]) -> Interaction | None:
        """The interaction whose messages and returned message ``messages`` extend: the longest, latest."""
        best: Interaction | None = None
        for item in self._items.values():
            if item.extended_by(messages) and (best is None or len(item.messages) >= len(best.messages)):
                best = item
        return best

    def _choices(self, completion_id: str) -> list[Interaction]:
        """The interaction ``completion_id`` and its sibling choices (``<id>-<index>``)."""
        return [i for k, i in self._items.items() if k == completion_id or k.startswith(f"{completion_id}-")]

    def set_reward(self, completion_id: str, reward: float) -> None:
        """Reward the interaction ``completion_id`` (every choice of it, for a completion of ``n > 1``)."""
        items = self._choices(completion_id)
        if not items:
            raise AgentError(f"set_reward: no interaction {completion_id!r} in the cache")
        for item in items:
            item.reward = float(reward)

    def set_last_reward(self, reward: float) -> None:
        """Reward the newest interaction."""
        if not self._items:
            raise AgentError("set_last_reward: the cache holds no interaction")
        next(reversed(self._items.values())).reward = float(reward)

    def children(self, completion_id: str) -> list[Interaction]:
        """The interactions that extend ``completion_id``."""
        return [i for i in self._items.values() if i.parent_id == completion_id]

    def apply_discount(self, gamma: float) -> None:
        """Propagate rewards to earlier turns, once: own reward (0 if unset) + ``gamma`` x children's
        (their mean when several). A second call raises :class:`AgentError`."""
        if self._discounted:
            raise AgentError("apply_discount was already applied to this cache; it runs once")
        if not 0 <= gamma <= 1:
            raise AgentError(f"apply_discount: gamma={gamma!r} must be in [0, 1]")
        self._discounted = True
        for item in reversed(list(self._items.values())):  # children always come after their parent
            kids = self.children(item.id)
            later = sum(k.reward or 0.0 for k in kids) / len(kids) if kids else 0.0
            item.reward = (item.reward or 0.0) + gamma * later

    def chain(self, completion_id: str) -> list[Interaction]:
        """The conversation ending at ``completion_id``, root first."""
        chain = [self[completion_id]]
        while chain[-1].parent_id is not None:
            chain.append(self[chain[-1].parent_id])
        return chain[::-1]

    def leaves(self) -> list[Interaction]:
        """Interactions no other one extends, in creation order."""
        parents = {i.parent_id for i in self._items.values()}
        return [i for i in self._items.values() if i.id not in parents]

    def export(self, style: ExportStyle = "concat") -> list[Trajectory]:
        """Validated trajectories: one per interaction (``individual``) or per leaf (``concat``)."""
        if style == "individual":
            return [_trajectory([item]) for item in self._items.values()]
        if style == "concat":
            return [_trajectory(self.chain(leaf.id)) for leaf in self.leaves()]
        raise AgentError(f"export style {style!r} is not 'concat' or 'individual'")


def _trajectory(chain: list[Interaction]) -> Trajectory:
    """One trajectory of a conversation ``chain`` (root first): the last prompt and output, trained on
    every turn's output tokens."""
    last = chain[-1]
    input_ids = [*last.prompt_ids, *last.output_ids]
    mask, logprobs, versions = [0] * len(input_ids), [0.0] * len(input_ids), [-1] * len(input_ids)
    for item in chain:
        start = len(item.prompt_ids)
        end = start + len(item.output_ids)
        if input_ids[start:end] != item.output_ids or input_ids[:start] != item.prompt_ids:
            raise AgentError(f"interaction {last.id}: its prompt does not extend turn {item.id}'s tokens")
        mask[start:end] = [1] * len(item.output_ids)
        logprobs[start:end] = item.output_logprobs
        versions[start:end] = item.output_versions
    mask[0] = 0  # the first token has no log-probability (an empty prompt cannot reach here)
    metadata = {
        "turns": len(chain),
        "completion_ids": [i.id for i in chain],
        "finish_reasons": [i.finish_reason for i in chain],
    }
    reward = last.reward if last.reward is not None else 0.0
    return Trajectory(input_ids, mask, logprobs, versions, float(reward), len(chain[0].prompt_ids), metadata).validate()
