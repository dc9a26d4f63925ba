"""Reward registry: built-in names and ``package.module:function`` import paths resolve to functions.

A reward function is a plain module-level function ``fn(completion: str, answer: str, **kwargs) ->
float`` (module-level so that worker processes can import it by name). ``@register_reward("name")``
adds one under a short name; :func:`resolve_reward` turns a spec (a registered name, or an import
path ``package.module:function`` / ``package.module.function``) into the function.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from areal_tasks.errors import RewardError

#: the reward-function signature: ``fn(completion, answer, **kwargs) -> float``.
RewardFn = Callable[..., float]

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: dict[str, RewardFn] = {}
_BUILTIN_MODULES = (
    "areal_tasks.rollout.rewards.builtin",
    "areal_tasks.rollout.rewards.math_rewards",
    "areal_tasks.rollout.rewards.sandbox",
)
IMPORT_PATH_FORM = "package.module:function"


def _load_builtins() -> None:
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)  # registers the built-in rewards on first import


def register_reward(name: str) -> Callable[[F], F]:
    """Decorator registering a module-level reward function under ``name`` (no ``.`` or ``:``)."""
    if not isinstance(name, str) or not name.strip() or any(c in name for c in ".: "):
        raise RewardError(f"reward name {name!r} must be a non-empty word without '.', ':' or spaces")

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise RewardError(f"@register_reward({name!r}) must decorate a function, got {type(fn).__name__}")
        known = _REGISTRY.get(name)
        if known is not None and _path(known) != _path(fn):
            raise RewardError(f"reward name {name!r} is already registered for {_path(known)}; pick another name")
        _REGISTRY[name] = fn
        return fn

    return decorate


def _path(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def reward_names() -> list[str]:
    """The registered reward names, sorted (the built-ins are always included)."""
    _load_builtins()
    return sorted(_REGISTRY)


def registered_name(fn: Callable[..., Any]) -> str | None:
    """The name ``fn`` is registered under, or None."""
    _load_builtins()
    return next((name for name, known in _REGISTRY.items() if known is fn), None)


def _split_import_path(spec: str) -> tuple[str, str]:
    if ":" in spec:
        module, _, attr = spec.partition(":")
    else:
        module, _, attr = spec.rpartition(".")
    if not module or not attr:
        raise RewardError(f"reward spec {spec!r} is not an import path of the form {IMPORT_PATH_FORM!r}")
    return module, attr


def resolve_reward(spec: str) -> RewardFn:
    """The reward function for ``spec``: a registered name or ``package.module:function``.

    ``package.module.function`` is accepted too (split at the last dot). Raises RewardError for an
    unknown name, a module that does not import, a missing attribute or a non-callable.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise RewardError(f"a reward spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    _load_builtins()
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if ":" not in spec and "." not in spec:
        raise RewardError(
            f"unknown reward {spec!r}; registered rewards: {', '.join(sorted(_REGISTRY))}; "
            f"or give an import path {IMPORT_PATH_FORM!r}"
        )
    module_name, attr = _split_import_path(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardError(f"reward {spec!r}: cannot import module {module_name!r}: {exc!r}") from exc
    except Exception as exc:
        raise RewardError(f"reward {spec!r}: importing module {module_name!r} failed: {exc!r}") from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise RewardError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    if not callable(target):
        raise RewardError(f"reward {spec!r} is a {type(target).__name__}, not a callable reward function")
    return target
