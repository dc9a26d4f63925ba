"""Secret values of a job config, and the environment channel that carries them to a job's processes.

What people read (``config.yaml``, ``rl_config.yaml``, ``config show``, MLflow params, checkpoint
metadata, job records) is the config as :func:`storage.redact.redact_value` shows it: values under
secret names (``storage.options.secret``), URL passwords and signatures become ``***``. The real
values travel in the environment, never on a command line (``ps`` shows every user a process's
argv) and never in a file:

    AREAL_CONFIG_SECRETS='{"storage.options.secret": "...", "tracking.mlflow_uri": "https://u:p@h"}'

a JSON object of dotted paths to values, applied by :func:`~areal_tasks.config.load_config` after
the file and the overrides (so a redacted file plus this variable loads back to the config that
was redacted). Values are taken as given (a string stays a string, never parsed as YAML). Users
set it instead of secret overrides; the training operator and the controller set it for the
processes they start (:func:`secrets_env`), and :func:`split_secret_overrides` tells which
overrides must move there. Every value read from it is registered with the redaction, so later
log lines and errors of the process mask it wherever it appears.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from areal_tasks.errors import ConfigError

if TYPE_CHECKING:
    from areal_tasks.config.job import JobConfig

logger = logging.getLogger(__name__)

__all__ = [
    "SECRETS_ENV",
    "apply_secrets",
    "is_secret_override",
    "read_secrets_env",
    "restore_redacted",
    "secret_values",
    "secrets_env",
    "split_secret_overrides",
]

#: environment variable holding a job's secret config values (JSON ``{dotted.path: value}``).
SECRETS_ENV = "AREAL_CONFIG_SECRETS"

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def is_secret_override(text: str) -> bool:
    """Whether the override ``key=value`` carries a secret (the redaction would change it)."""
    from storage.redact import redact_argv

    return redact_argv([text]) != [text]


def split_secret_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(public, secret)``: the overrides that may go on a command line, and those that may not."""
    public = [o for o in overrides if not is_secret_override(o)]
    secret = [o for o in overrides if is_secret_override(o)]
    return public, secret


def _changed(plain: Any, shown: Any, keys: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(path, real value)`` of every place where the redacted tree differs from the real one,
    as deep as a dotted path can name it (a key that is not a plain name stops the descent)."""
    if type(plain) is type(shown) and plain == shown:
        return
    if (
        isinstance(plain, dict)
        and isinstance(shown, dict)
        and plain.keys() == shown.keys()
        and all(isinstance(k, str) and _PLAIN_KEY.match(k) for k in plain)
    ):
        for key in plain:
            yield from _changed(plain[key], shown[key], (*keys, key))
        return
    yield keys, plain


def secret_values(cfg: JobConfig) -> dict[str, Any]:
    """``{dotted path: real value}`` of everything the redacted config hides."""
    from areal_tasks.config.serialize import config_to_dict

    plain = config_to_dict(cfg, show_secrets=True)
    shown = config_to_dict(cfg)
    return {".".join(keys): value for keys, value in _changed(plain, shown, ()) if keys}


def value_at(cfg: JobConfig, path: str) -> Any:
    """The real value at dotted ``path`` of ``cfg`` (ConfigError when there is none)."""
    from areal_tasks.config.serialize import config_to_dict

    node: Any = config_to_dict(cfg, show_secrets=True)
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise ConfigError(f"{path}: not a path of the configuration")
        node = node[key]
    return node


def secrets_env(cfg: JobConfig, overrides: Sequence[str] = ()) -> dict[str, str]:
    """The environment that gives a process loading the redacted ``cfg`` (plus the public
    ``overrides``) back the real one: ``{SECRETS_ENV: json}``, or ``{}`` when nothing is secret.

    ``overrides`` are the secret overrides left off the command line: each one's path gets its
    final value, so the parts of a mapping override that are not secret come back too.
    """
    from areal_tasks.config.overrides import parse_override

    values = secret_values(cfg)
    for text in overrides:
        path = parse_override(text).path
        values[path] = value_at(cfg, path)
    if not values:
        return {}
    return {SECRETS_ENV: json.dumps(dict(sorted(values.items())))}


def read_secrets_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The secret values in ``environ[SECRETS_ENV]`` (default ``os.environ``), registered with the
    redaction; ``{}`` when unset. ConfigError (quoting no value) when it is not a JSON object of
    dotted paths."""
    from storage.redact import hidden_parts, register_secret

    raw = (os.environ if environ is None else environ).get(SECRETS_ENV, "")
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"${SECRETS_ENV} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            'it must be an object of dotted paths to values, e.g. {"storage.options.secret": "..."}'
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f'${SECRETS_ENV} must be a JSON object of dotted paths to values, e.g. {{"storage.options.secret": '
            f'"..."}}, got a JSON {type(data).__name__}'
        )
    for path, value in data.items():
        # a URL's password rather than the whole URL; a value the rules would not hide, whole
        register_secret(hidden_parts(value, str(path)) or value)
    return data


def apply_secrets(tree: dict[str, Any], secrets: Mapping[str, Any], schema: type, origins: dict[str, str]) -> None:
    """Set each ``{dotted path: value}`` of ``secrets`` in the config ``tree`` (in place), checking
    the paths against ``schema``; one ConfigError lists every bad path (never a value)."""
    from areal_tasks.config.build import format_problems
    from areal_tasks.config.overrides import Override, apply_override

    problems: list[str] = []
    for path, value in secrets.items():
        keys = tuple(str(path).split("."))
        if not all(_PLAIN_KEY.match(k) for k in keys):
            problems.append(f"{path!r} is not a dotted path such as storage.options.secret")
            continue
        raw = value if isinstance(value, str) else json.dumps(value)
        override = Override(text=f"{path}=*** (from ${SECRETS_ENV})", keys=keys, value=value, raw=raw)
        try:
            apply_override(tree, override, schema, origins)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError(format_problems(problems, what=f"invalid ${SECRETS_ENV}"))
    if secrets:
        logger.debug("applied %d secret value(s) from $%s", len(secrets), SECRETS_ENV)


def restore_redacted(
    values: Mapping[str, Any], prefix: str, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A copy of ``values``, the redacted mapping at dotted ``prefix`` of a config (the DAGs hand
    ``storage.options`` from task to task), with each ``***`` that ``$AREAL_CONFIG_SECRETS`` has a
    value for put back. Placeholders it has no value for stay (their user says so, by name)."""
    from storage.redact import REDACTED

    known: dict[str, Any] = {}
    for path, value in read_secrets_env(environ).items():
        if path == prefix and isinstance(value, Mapping):
            known.update(value)
        elif path.startswith(prefix + "."):
            node = known
            *parents, last = path[len(prefix) + 1 :].split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[last] = value

    def restore(shown: Any, real: Any) -> Any:
        if isinstance(shown, Mapping):
            real = real if isinstance(real, Mapping) else {}
            return {key: restore(item, real.get(key)) for key, item in shown.items()}
        return real if shown == REDACTED and real is not None else shown

    return restore(values, known)
