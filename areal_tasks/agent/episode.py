"""What the agent workflows share: loading the agent, the item an agent sees, and the episode's sample.

:func:`episode_trajectory` turns an episode's interaction cache into the one trajectory the rollout
executor takes per episode: the conversation that ends in the **last** completion (concatenated;
only model-generated tokens trained), rewarded by precedence (the agent's returned number, else
rewards the agent set, else the job's reward function on the last completion's text). Other
conversations of the episode (an agent that restarted its history) are counted in the metadata
(``other_conversations``), not trained: the executor takes one sample per episode.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import AgentError, ConfigError
from areal_tasks.rollout.workflows.rlvr import RewardFn, item_fields, reward_extras

if TYPE_CHECKING:
    from areal_tasks.agent.interactions import Interaction, InteractionCache
    from areal_tasks.api.workflow import Trajectory

logger = logging.getLogger(__name__)

__all__ = ["episode_trajectory", "interaction_text", "item_payload", "project_path", "resolve_callable"]


def project_path(path: str, base: str | None = None) -> str:
    """A relative ``path`` as the job finds it: under ``base`` (default the working directory) when it
    exists there, else under the checkout holding ``areal_tasks`` when it exists there (as config
    paths resolve: ``examples/agents/...`` works whatever directory the job runs in), else unchanged."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or (Path(base or ".") / candidate).exists():
        return path
    import areal_tasks

    in_checkout = Path(areal_tasks.__file__).resolve().parents[1] / candidate
    return str(in_checkout) if in_checkout.exists() else path


def resolve_callable(path: str, where: str) -> Callable[..., Any]:
    """The callable at ``package.module:name`` or ``path/to/file.py:name`` (a file path relative to
    the working directory, else to the checkout: :func:`project_path`); ConfigError naming ``where``
    otherwise."""
    module_name, sep, attr = path.rpartition(":")
    if not (sep and module_name and attr):
        raise ConfigError(f"{where}: {path!r} is not an import path package.module:function or file.py:function")
    try:
        if module_name.endswith(".py"):
            module = _load_file(project_path(module_name))
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as exc:
        raise ConfigError(f"{where}: cannot import {module_name!r} ({exc})") from exc
    target = getattr(module, attr, None)
    if not callable(target):
        raise ConfigError(f"{where}: {module_name!r} has no callable {attr!r}")
    return target  # type: ignore[no-any-return]


def _load_file(file: str) -> ModuleType:
    """Import a Python file as a module of its own (cached by its resolved path)."""
    resolved = Path(file).resolve()
    name = "areal_agent_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None or not resolved.is_file():
        raise ImportError(f"no Python file at {resolved}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def item_payload(data: Any, system_prompt: str | None) -> dict[str, Any]:
    """The item as an agent program sees it: its fields without ``answer``, ``tests`` and ``metadata``
    (what the reward scores against), plus ``system_prompt``."""
    if isinstance(data, Mapping):
        fields = dict(data)
    elif dataclasses.is_dataclass(data) and not isinstance(data, type):
        fields = dataclasses.asdict(data)
    else:
        prompt, _ = item_fields(data)
        fields = {"prompt": prompt}
    for hidden in ("answer", "tests", "metadata"):  # what the reward scores against stays hidden
        fields.pop(hidden, None)
    if system_prompt:
        fields["system_prompt"] = system_prompt
    return fields


def interaction_text(item: Interaction, tokenizer: Any) -> str:
    """What the agent received as the completion's text: a chat message's content (the tool-call
    markup removed), or a text completion's decoded output."""
    if item.message is not None:
        return str(item.message.get("content") or "")
    completion = item.completion
    for choice in getattr(completion, "choices", None) or ():
        choice_id = completion.id if choice.index == 0 else f"{completion.id}-{choice.index}"
        if choice_id == item.id and isinstance(getattr(choice, "text", None), str):
            return str(choice.text)
    ids = item.output_ids[:-1] if item.ended_with is not None else item.output_ids
    return str(tokenizer.decode(ids, skip_special_tokens=False))


async def episode_trajectory(
    cache: InteractionCache,
    data: Any,
    reward: RewardFn,
    tokenizer: Any,
    *,
    returned: float | None,
    max_prompt_len: int | None,
) -> Trajectory | None:
    """The episode's sample (see the module doc); None when the agent generated nothing or the
    conversation's prompt is longer than ``max_prompt_len``."""
    interactions = list(cache)
    if not interactions:
        logger.debug("rejecting an episode whose agent made no completion")
        return None
    last = interactions[-1]
    if not last.output_ids:
        logger.debug("rejecting an episode whose last completion generated nothing")
        return None
    _, answer = item_fields(data)
    text = interaction_text(last, tokenizer)
    if returned is not None:
        last.reward = returned
    elif all(i.reward is None for i in interactions):
        last.reward = float(await reward(text, answer, **reward_extras(data)))
    conversations = cache.export("concat")
    chosen = [t for t in conversations if t.metadata["completion_ids"][-1] == last.id]
    if len(chosen) != 1:
        raise AgentError(f"the interaction cache exported no conversation ending in {last.id}")
    traj = chosen[0]
    if max_prompt_len is not None and traj.prompt_len > max_prompt_len:
        logger.debug(
            "rejecting a conversation whose prompt has %d tokens (max_prompt_len=%d)", traj.prompt_len, max_prompt_len
        )
        return None
    traj.metadata.update(
        completion=text,
        answer=answer,
        stop_reason=last.finish_reason,
        other_conversations=len(conversations) - 1,
    )
    return traj
