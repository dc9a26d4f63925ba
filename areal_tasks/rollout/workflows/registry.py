"""The workflow registry: name -> factory, each workflow's options, and the job's workflow from its config.

:data:`WORKFLOWS` maps each built-in name to its factory ``factory(tokenizer, sampling, reward,
**options)`` (lazily imported: listing names imports no workflow); ``rollout.workflow.name`` may also
be an import path ``package.module:factory``. A factory's options are what ``rollout.workflow.options``
holds: a factory with an ``options_class`` (a dataclass, e.g. ``MultiTurnOptions``) takes exactly its
fields, type- and range-checked; one without takes the keyword parameters of its signature (anything,
with ``**kwargs``). Every workflow also gets, from the job rather than from ``options``, the
``system_prompt`` (``rollout.workflow.system_prompt``, when set) and ``max_prompt_len``
(``dataset.max_prompt_len``).

:func:`workflow_problems` is the check config validation runs (an import-path workflow is then
checked only for its form: its module is imported by :func:`check_workflow` before the job starts,
and when it is built). :func:`build_workflow` builds the job's workflow. Adding a workflow is one
module and one ``WORKFLOWS.register(name, factory)``; the contract test covers every registered name.
Torch-free.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import TYPE_CHECKING, Any, Protocol

from areal_tasks.errors import ConfigError
from areal_tasks.registry import Registry

if TYPE_CHECKING:
    from areal_tasks.api.inference import SamplingParams
    from areal_tasks.api.workflow import RolloutWorkflow
    from areal_tasks.config.rollout import WorkflowConfig
    from areal_tasks.rollout.workflows.rlvr import RewardFn

__all__ = [
    "JOB_OPTIONS",
    "WORKFLOWS",
    "WorkflowFactory",
    "build_workflow",
    "check_workflow",
    "make_workflow",
    "resolve_workflow",
    "workflow_problems",
]


class WorkflowFactory(Protocol):
    """Builds a workflow from a tokenizer, sampling parameters, a reward and keyword options."""

    def __call__(
        self, tokenizer: Any, sampling: SamplingParams, reward: RewardFn, **options: Any
    ) -> RolloutWorkflow: ...


#: every built-in workflow, by name (register yours with ``WORKFLOWS.register(name, factory)``).
WORKFLOWS: Registry[WorkflowFactory] = Registry(
    "workflow",
    {
        "rlvr": "areal_tasks.rollout.workflows.rlvr:RLVRWorkflow",
        "multi_turn": "areal_tasks.rollout.workflows.multi_turn:MultiTurnWorkflow",
        # rlvr for prompts with images, rendered through the model's processor
        "vision": "areal_tasks.rollout.workflows.vision:VisionRLVRWorkflow",
        # agent code through ArealOpenAI, and any OpenAI-speaking program through a proxy session
        "agent": "areal_tasks.agent.workflow:AgentWorkflow",
        "agent_command": "areal_tasks.agent.command_workflow:AgentCommandWorkflow",
    },
)

#: keyword options every workflow gets from the job, never from ``rollout.workflow.options``.
JOB_OPTIONS = ("system_prompt", "max_prompt_len")
_PATH = "rollout.workflow"


def is_import_path(name: str) -> bool:
    """Whether ``name`` has the form ``package.module:factory``."""
    module_name, sep, attr = name.partition(":")
    return bool(sep and module_name and attr)


def resolve_workflow(name: str) -> WorkflowFactory:
    """The factory registered as ``name``, or the one at import path ``package.module:factory``."""
    if name in WORKFLOWS:
        return WORKFLOWS.get(name)
    if not is_import_path(name):
        raise ConfigError(
            f"unknown workflow {name!r}; {WORKFLOWS.hint(name)}, or an import path package.module:factory of "
            "factory(tokenizer, sampling, reward, **options)"
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"workflow {name!r}: cannot import {module_name!r} ({exc})") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"workflow {name!r}: {module_name!r} has no callable {attr!r}")
    return factory  # type: ignore[no-any-return]


def workflow_problems(config: WorkflowConfig, *, load: bool = False) -> list[str]:
    """``"<path>: <problem>"`` lines for ``rollout.workflow``: an unknown name, options the workflow
    does not take or with bad values, a system prompt that is not text. An import-path workflow is
    imported (and its options checked) only with ``load``."""
    problems: list[str] = []
    if config.system_prompt is not None and not isinstance(config.system_prompt, str):
        problems.append(f"{_PATH}.system_prompt: must be text or null, got {config.system_prompt!r}")
    if config.name not in WORKFLOWS and not (is_import_path(config.name) and not load):
        try:
            resolve_workflow(config.name)
        except ConfigError as exc:
            return [*problems, f"{_PATH}.name: {exc}"]
    if config.name not in WORKFLOWS and not load:
        return problems
    return problems + _option_problems(config.name, resolve_workflow(config.name), config.options)


def check_workflow(config: WorkflowConfig) -> None:
    """Raise one :class:`ConfigError` listing :func:`workflow_problems` (import-path workflows loaded)."""
    from areal_tasks.config.build import format_problems

    problems = workflow_problems(config, load=True)
    if problems:
        raise ConfigError(format_problems(problems))


def _option_problems(name: str, factory: WorkflowFactory, options: dict[str, Any]) -> list[str]:
    path = f"{_PATH}.options"
    given = [key for key in options if key in JOB_OPTIONS]
    problems = [
        f"{path}.{key}: set by the job, not as a workflow option (use {_PATH}.system_prompt or dataset.max_prompt_len)"
        for key in given
    ]
    options = {k: v for k, v in options.items() if k not in JOB_OPTIONS}
    schema = getattr(factory, "options_class", None)
    if schema is not None and not dataclasses.fields(schema):
        if options:
            problems.append(f"{path}: workflow {name!r} takes no options, got {', '.join(map(repr, options))}")
        return problems
    if schema is not None:
        from areal_tasks.config.build import dataclass_problems

        return problems + dataclass_problems(schema, options, path=path)
    accepted = _keyword_parameters(factory)
    if accepted is not None:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            problems.append(
                f"{path}: workflow {name!r} takes no option {', '.join(map(repr, unknown))}; "
                f"it takes: {', '.join(sorted(accepted)) or 'none'}"
            )
    return problems


def _keyword_parameters(factory: WorkflowFactory) -> list[str] | None:
    """The option names ``factory`` accepts: its keyword parameters after the three positional ones
    (tokenizer, sampling, reward); None when it takes any (``**kwargs``)."""
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): accept anything
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    fed = {p.name for p in positional[:3]}
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in fed]


def workflow_options(config: WorkflowConfig, *, max_prompt_len: int | None) -> dict[str, Any]:
    """The keyword options the job's workflow is built with: its own, the system prompt (when set) and
    ``max_prompt_len``."""
    options: dict[str, Any] = {**config.options, "max_prompt_len": max_prompt_len}
    if config.system_prompt is not None:
        options["system_prompt"] = config.system_prompt
    return options


def build_workflow(
    config: WorkflowConfig, tokenizer: Any, sampling: SamplingParams, reward: RewardFn, *, max_prompt_len: int | None
) -> RolloutWorkflow:
    """The job's workflow (``rollout.workflow``) with ``sampling`` and the ``reward`` coroutine."""
    return make_workflow(
        config.name, tokenizer, sampling, reward, **workflow_options(config, max_prompt_len=max_prompt_len)
    )


def make_workflow(
    name: str, tokenizer: Any, sampling: SamplingParams, reward: RewardFn, **options: Any
) -> RolloutWorkflow:
    """The workflow ``name`` (registered, or an import path) built with ``options``; ConfigError if
    unknown, or if it builds something else than a RolloutWorkflow."""
    from areal_tasks.api.workflow import RolloutWorkflow

    workflow = resolve_workflow(name)(tokenizer, sampling, reward, **options)
    if not isinstance(workflow, RolloutWorkflow):
        raise ConfigError(f"workflow {name!r} built a {type(workflow).__name__}, not a RolloutWorkflow")
    return workflow
